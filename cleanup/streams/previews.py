"""Where a dry run started the shards it read from LATEST, kept for the enforce run that follows it.

LATEST is no position one can come back to: a shard started there is pinned (``cleanup.streams.shard_state.Pins``)
at the first record it read, or at the service's time when it started. An enforce consumer writes its pin as a
checkpoint, under the stream's lease. A dry run writes no checkpoint and holds no lease, but the enforce run that
follows it must clean what it only planned: so a dry run keeps its pins apart, one item per shard (``stream`` =
``preview#<stream ARN>``, ``shard`` = the shard id, with ``atSequenceNumber`` or ``since`` as a pin has them), written
only where none is (the earliest dry run's place stands) and only when the checkpoint table exists (a dry run
creates nothing). A consumer starting a shard that has no checkpoint and no pin of its own starts from the preview's
pin instead of LATEST. Items expire (``expiresAt``) PREVIEW_DAYS after they are written: by then the stream holds
nothing from before them.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from cleanup.exceptions import CleanupError
from cleanup.streams.checkpoint_table import EXPIRY_ATTRIBUTE, table_call_or_gone
from cleanup.streams.checkpoints import Checkpoint, checkpoint_of
from cleanup.telemetry import log

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

PREVIEW_PREFIX = "preview#"
PREVIEW_DAYS = 2


class PreviewPins:
    """The dry runs' pins of one stream's shards."""

    def __init__(self, dynamodb: DynamoDBClient, table: str, stream_arn: str) -> None:
        self._dynamodb = dynamodb
        self._table = table
        self._partition = f"{PREVIEW_PREFIX}{stream_arn}"
        self.pins: dict[str, Checkpoint] = {}

    def load(self) -> dict[str, Checkpoint]:
        """Read the pins (one Query; none when the table does not exist).

        Raises:
            TransientError: throttling or a server error.
            CheckpointTableError: anything else, e.g. a missing permission.
        """
        answer = table_call_or_gone(
            self._dynamodb.query,
            "Query",
            self._table,
            ("ResourceNotFoundException",),
            TableName=self._table,
            KeyConditionExpression="#s = :s",
            ExpressionAttributeNames={"#s": "stream"},
            ExpressionAttributeValues={":s": {"S": self._partition}},
            ConsistentRead=True,
        )
        items = answer.get("Items", []) if answer else []
        self.pins = {item["shard"]["S"]: checkpoint_of(item) for item in items}
        return self.pins

    def keep(self, shard_id: str, pin: Checkpoint) -> None:
        """Write a dry run's pin unless one is there (best effort: a pin not written is logged, and the enforce run
        then starts that shard at LATEST)."""
        if shard_id in self.pins or (pin.at is None and pin.since is None):
            return
        item: dict[str, Any] = {
            "stream": {"S": self._partition},
            "shard": {"S": shard_id},
            EXPIRY_ATTRIBUTE: {"N": str(math.ceil(time.time() + PREVIEW_DAYS * 86_400))},
        }
        if pin.at is not None:
            item["atSequenceNumber"] = {"S": pin.at}
        if pin.since is not None:
            item["since"] = {"N": repr(pin.since)}
        try:
            table_call_or_gone(
                self._dynamodb.put_item,
                "PutItem",
                self._table,
                ("ConditionalCheckFailedException", "ResourceNotFoundException"),  # kept already; no table
                TableName=self._table,
                Item=item,
                ConditionExpression="attribute_not_exists(#k)",
                ExpressionAttributeNames={"#k": "shard"},
            )
        except CleanupError as exc:
            log.warning(
                "dry run: its place in the shard not kept; the enforce run that follows starts it at LATEST",
                extra={"shardId": shard_id, "error": str(exc)},
            )
            return
        self.pins[shard_id] = pin
        log.info(
            "dry run: place kept for the enforce run", extra={"shardId": shard_id, "at": pin.at, "since": pin.since}
        )


def has_place(checkpoint: Checkpoint | None) -> bool:
    """Whether a checkpoint item says where to read from (a position, a pin, or finished), not only that the shard
    was started."""
    return checkpoint is not None and (
        checkpoint.finished
        or checkpoint.sequence_number is not None
        or checkpoint.at is not None
        or checkpoint.since is not None
    )
