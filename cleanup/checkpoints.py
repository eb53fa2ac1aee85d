"""Per-shard checkpoints and the one-consumer lease of a stream, in one DynamoDB table (CHECKPOINT_TABLE).

Items (hash key ``stream``: the stream ARN, range key ``shard``):

* one per shard: ``sequenceNumber`` (the last record up to which everything is clean) and ``finished`` (the shard is
  closed and every record of it is clean: it is never read again);
* one lease (``shard`` = ``#lease``): ``owner`` and ``version``.

A checkpoint is written in one transaction with a check that its writer still owns the lease (``cleanup.lease``), so
a consumer that lost the lease can never move a checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from cleanup.aws_errors import error_code, translate
from cleanup.exceptions import LeaseLostError, TransientError
from cleanup.lease import LEASE_SHARD, Lease
from cleanup.telemetry import log

TABLE_ACTIVE_TIMEOUT_SECONDS = 120.0


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Where a shard stands: everything up to ``sequence_number`` is clean; ``finished`` when the shard is done."""

    sequence_number: str | None
    finished: bool = False


def ensure_table(dynamodb: Any, table: str, sleep: Callable[[float], None] = time.sleep) -> None:
    """Create the checkpoint table (on-demand) if it does not exist, and wait until it is ACTIVE."""
    try:
        status = dynamodb.describe_table(TableName=table)["Table"]["TableStatus"]
    except ClientError as exc:
        if error_code(exc) != "ResourceNotFoundException":
            raise translate(exc, "DescribeTable") from exc
        status = _create_table(dynamodb, table)
    waited = 0.0
    while status != "ACTIVE":
        if waited > TABLE_ACTIVE_TIMEOUT_SECONDS:
            raise TransientError(f"checkpoint table {table} still {status} after {waited:.0f} s")
        sleep(1.0)
        waited += 1.0
        status = dynamodb.describe_table(TableName=table)["Table"]["TableStatus"]


def _create_table(dynamodb: Any, table: str) -> str:
    log.info("creating the checkpoint table", extra={"table": table})
    try:
        created = dynamodb.create_table(
            TableName=table,
            AttributeDefinitions=[
                {"AttributeName": "stream", "AttributeType": "S"},
                {"AttributeName": "shard", "AttributeType": "S"},
            ],
            KeySchema=[{"AttributeName": "stream", "KeyType": "HASH"}, {"AttributeName": "shard", "KeyType": "RANGE"}],
            BillingMode="PAY_PER_REQUEST",
        )
    except ClientError as exc:
        if error_code(exc) == "ResourceInUseException":  # another consumer created it first
            return "CREATING"
        raise translate(exc, "CreateTable") from exc
    return str(created["TableDescription"]["TableStatus"])


class CheckpointStore:
    """The checkpoints of one stream's shards, written only while ``lease`` is held."""

    def __init__(self, dynamodb: Any, table: str, stream_arn: str, lease: Lease) -> None:
        self._dynamodb = dynamodb
        self._table = table
        self._stream = stream_arn
        self._lease = lease

    def load(self) -> dict[str, Checkpoint]:
        """Every shard's checkpoint (one Query, paged)."""
        checkpoints: dict[str, Checkpoint] = {}
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "stream = :stream",
            "ExpressionAttributeValues": {":stream": {"S": self._stream}},
            "ConsistentRead": True,
        }
        while True:
            try:
                page = self._dynamodb.query(**kwargs)
            except (ClientError, BotoCoreError) as exc:
                raise translate(exc, "Query checkpoints") from exc
            for item in page.get("Items", []):
                shard = item["shard"]["S"]
                if shard != LEASE_SHARD:
                    number = item.get("sequenceNumber", {}).get("S")
                    checkpoints[shard] = Checkpoint(number, item.get("finished", {}).get("BOOL", False))
            if "LastEvaluatedKey" not in page:
                return checkpoints
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def save(self, shard_id: str, checkpoint: Checkpoint) -> None:
        """Write ``shard_id``'s checkpoint, fenced by the lease.

        Raises:
            LeaseLostError: another consumer owns the stream; nothing was written.
            TransientError: throttling or a server error; nothing was written.
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
        self._transact([self._lease.condition_check(), {"Put": {"TableName": self._table, "Item": item}}])

    def forget(self, shard_id: str) -> None:
        """Delete the checkpoint of a shard that is no longer in the stream."""
        key = {"stream": {"S": self._stream}, "shard": {"S": shard_id}}
        self._transact([self._lease.condition_check(), {"Delete": {"TableName": self._table, "Key": key}}])

    def _transact(self, items: list[dict[str, Any]]) -> None:
        try:
            self._dynamodb.transact_write_items(TransactItems=items)
        except ClientError as exc:
            reasons = exc.response.get("CancellationReasons") or []
            if reasons and reasons[0].get("Code") == "ConditionalCheckFailed":
                self._lease.mark_lost()
                raise LeaseLostError("the stream lease is held by another consumer") from exc
            raise translate(exc, "TransactWriteItems checkpoint") from exc
        except BotoCoreError as exc:
            raise translate(exc, "TransactWriteItems checkpoint") from exc
