"""Per-shard checkpoints and the one-consumer lease of a stream, in one DynamoDB table (CHECKPOINT_TABLE).

Items (hash key ``stream``: the stream ARN, range key ``shard``):

* one per shard: ``sequenceNumber`` (the last record up to which everything is clean) and ``finished`` (the shard is
  closed and every record of it is clean: it is never read again); for a shard started at LATEST that has no clean
  record yet, its pin: ``atSequenceNumber`` (the first record it read) or ``since`` (when it started). ``position``
  is the same place as a string that sorts as the stream does: a checkpoint is only written over one at or before
  it, so it never moves backwards, whoever writes it;
* one lease (``shard`` = ``#lease``): ``owner`` and ``version``.

A checkpoint is written in one transaction with a check that its writer still owns the lease
(``cleanup.streams.lease``), so a consumer that lost the lease can never move a checkpoint.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cleanup.aws.calls import call
from cleanup.exceptions import CleanupError, ConditionFailedError, LeaseLostError
from cleanup.streams.checkpoint_table import ensure_table, table_call, table_error
from cleanup.streams.lease import LEASE_SHARD, Lease

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import PutTypeDef, TransactWriteItemTypeDef

__all__ = ["Checkpoint", "CheckpointStore", "checkpoint_of", "ensure_table"]

SAVE_ACTIONS = ("dynamodb:PutItem", "dynamodb:ConditionCheckItem")
SEQUENCE_DIGITS = 40  # DynamoDB Streams' longest sequence number
FINISHED = "~"  # sorts after every position: nothing is written over a finished shard
FORGET_ACTIONS = ("dynamodb:DeleteItem", "dynamodb:ConditionCheckItem")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Where a shard stands: everything up to ``sequence_number`` is clean; ``finished`` when the shard is done."""

    sequence_number: str | None
    finished: bool = False
    at: str | None = None
    """A shard started at LATEST, pinned at the first record it read (not clean yet): read again from there."""
    since: float | None = None
    """A shard started at LATEST that has read no record of its own yet: the service's time when it started (records
    older than that, less a margin, were there before the start and are passed over)."""

    @property
    def position(self) -> str | None:
        """Where the checkpoint stands, as a string that sorts in stream order (None: before any record)."""
        if self.finished:
            return FINISHED
        if self.sequence_number is not None:
            return self.sequence_number.rjust(SEQUENCE_DIGITS, "0") + "1"  # after the record
        if self.at is not None:
            return self.at.rjust(SEQUENCE_DIGITS, "0") + "0"  # at the record: before "after" it
        return None


class CheckpointStore:
    """The checkpoints of one stream's shards, written only while ``lease`` is held."""

    def __init__(self, dynamodb: DynamoDBClient, table: str, stream_arn: str, lease: Lease) -> None:
        self._dynamodb = dynamodb
        self._table = table
        self._stream = stream_arn
        self._lease = lease

    @property
    def dynamodb(self) -> DynamoDBClient:
        return self._dynamodb

    @property
    def table(self) -> str:
        return self._table

    @property
    def stream_arn(self) -> str:
        return self._stream

    def load(self) -> dict[str, Checkpoint]:
        """Every shard's checkpoint (one Query, paged).

        Raises:
            TransientError: throttling or a server error.
            CheckpointTableError: anything else, e.g. a missing permission.
        """
        checkpoints: dict[str, Checkpoint] = {}
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "stream = :stream",
            "ExpressionAttributeValues": {":stream": {"S": self._stream}},
            "ConsistentRead": True,
        }
        while True:
            page = table_call(self._dynamodb.query, "Query", self._table, **kwargs)
            for item in page.get("Items", []):
                shard = item["shard"]["S"]
                if shard != LEASE_SHARD:
                    checkpoints[shard] = checkpoint_of(item)
            if "LastEvaluatedKey" not in page:
                return checkpoints
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def save(self, shard_id: str, checkpoint: Checkpoint) -> None:
        """Write ``shard_id``'s checkpoint, fenced by the lease.

        Raises:
            LeaseLostError: another consumer owns the stream, or has checkpointed the shard further; nothing was
                written.
            TransientError: throttling or a server error; nothing was written.
            CheckpointTableError: anything else, e.g. a missing permission; nothing was written.
        """
        item: dict[str, Any] = {
            "stream": {"S": self._stream},
            "shard": {"S": shard_id},
            "finished": {"BOOL": checkpoint.finished},
            "owner": {"S": self._lease.owner},
            "updatedAt": {"N": str(int(time.time()))},
        }
        if checkpoint.sequence_number is not None:
            item["sequenceNumber"] = {"S": checkpoint.sequence_number}
        if checkpoint.at is not None:
            item["atSequenceNumber"] = {"S": checkpoint.at}
        if checkpoint.since is not None:
            item["since"] = {"N": repr(checkpoint.since)}
        put: PutTypeDef = {
            "TableName": self._table,
            "Item": item,
            "ConditionExpression": "attribute_not_exists(#p)",
            "ExpressionAttributeNames": {"#p": "position"},
        }
        if checkpoint.position is not None:
            item["position"] = {"S": checkpoint.position}
            put["ConditionExpression"] = "attribute_not_exists(#p) OR #p <= :p"
            put["ExpressionAttributeValues"] = {":p": {"S": checkpoint.position}}
        self._transact([self._lease.condition_check(), {"Put": put}], SAVE_ACTIONS)

    def forget(self, shard_id: str) -> None:
        """Delete the checkpoint of a shard that is no longer in the stream (raises as ``save`` does)."""
        key = {"stream": {"S": self._stream}, "shard": {"S": shard_id}}
        self._transact(
            [self._lease.condition_check(), {"Delete": {"TableName": self._table, "Key": key}}], FORGET_ACTIONS
        )

    def _transact(self, items: list[TransactWriteItemTypeDef], actions: tuple[str, ...]) -> None:
        try:
            call(self._dynamodb.transact_write_items, "TransactWriteItems", None, TransactItems=items)
        except ConditionFailedError as exc:  # the lease's, or a checkpoint further on than this one: either way,
            self._lease.mark_lost()  # this consumer's view is stale: it stops, takes the lease again, reloads
            raise LeaseLostError("another consumer holds the stream's lease, or has checkpointed further") from exc
        except CleanupError as exc:
            raise table_error(exc, self._table, "TransactWriteItems", actions) from exc


def checkpoint_of(item: dict[str, Any]) -> Checkpoint:
    """The checkpoint a shard's item of the table holds."""
    since = item.get("since", {}).get("N")
    return Checkpoint(
        item.get("sequenceNumber", {}).get("S"),
        item.get("finished", {}).get("BOOL", False),
        at=item.get("atSequenceNumber", {}).get("S"),
        since=float(since) if since is not None else None,
    )
