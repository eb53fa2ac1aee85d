"""Records a stream lost before they were read, each reported once: the loss ledger, in CHECKPOINT_TABLE.

A loss (records trimmed from a shard after the stream's retention, a shard or a whole stream gone, before they were
read) is reported with an ERROR line naming the shard and the range, the ``RecordsLost`` metric and the consumer's
summary; then it is written down, and a consumer that finds the same loss again (a restart reading the same trimmed
checkpoint, a gone stream's checkpoints not forgotten yet) finds it there and says so at INFO only.

The ledger is read before the report and written after it: a process that stops between the two reports the loss
once more on its next start, never not at all. A dry run reads the ledger and writes nothing, so the enforce run that
follows reports what the dry run found, once. A table that cannot be read or written never holds a report back.

Items (hash key ``stream`` = ``lost#<scope>``: the stream's ARN, or the KCL processor's scope; range key ``shard`` =
``<shard id>#<the record the loss follows, or "start">``): ``before`` (the first record read after it, if any),
``why``, ``reportedAt`` and ``expiresAt`` (the table's TTL attribute): LEDGER_DAYS after the report, long after any
consumer can find the same loss again.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cleanup.exceptions import CleanupError
from cleanup.streams.checkpoint_table import EXPIRY_ATTRIBUTE, table_call, table_call_or_gone
from cleanup.telemetry import log

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

    from cleanup.runtime import Runtime

LEDGER_PREFIX = "lost#"
LEDGER_DAYS = 8
"""How long a reported loss is remembered: a stream keeps a record a day, and a gone stream's checkpoints are
forgotten once its loss is reported; a week more covers a consumer stopped for that long."""


@dataclass(frozen=True, slots=True)
class Loss:
    """Records of one shard that no reader can read any more: those after ``after`` (None: from the shard's first
    record) and before ``before`` (None: up to the shard's end, or unknown), and why."""

    shard_id: str
    after: str | None
    before: str | None
    why: str

    def as_dict(self) -> dict[str, str | None]:
        return {"shardId": self.shard_id, "after": self.after, "before": self.before, "why": self.why}

    @property
    def key(self) -> str:
        return f"{self.shard_id}#{self.after or 'start'}"


class LossLedger:
    """The losses of one stream (or one KCL application), as reported so far."""

    def __init__(self, dynamodb: DynamoDBClient, table: str, scope: str, writes: Callable[[], bool]) -> None:
        """``writes``: whether this consumer writes (False in a dry run, asked at each report)."""
        self._dynamodb = dynamodb
        self._table = table
        self._partition = f"{LEDGER_PREFIX}{scope}"
        self._writes = writes

    def report(self, runtime: Runtime, loss: Loss) -> bool:
        """Report ``loss`` unless it was reported before; True when reported now."""
        if self._known(loss):
            log.info("loss already reported", extra={**_fields(loss), "ledger": self._partition})
            return False
        log.error("records lost: no reader can read them any more", extra=_fields(loss))
        runtime.metrics.count("RecordsLost")
        runtime.metrics.flush()
        if self._writes():
            self._write(loss)
        return True

    def _known(self, loss: Loss) -> bool:
        try:
            answer = table_call_or_gone(
                self._dynamodb.query,
                "Query",
                self._table,
                ("ResourceNotFoundException",),  # no table yet (a dry run): nothing was reported
                TableName=self._table,
                KeyConditionExpression="#s = :s AND #k = :k",
                ExpressionAttributeNames={"#s": "stream", "#k": "shard"},
                ExpressionAttributeValues={":s": {"S": self._partition}, ":k": {"S": loss.key}},
                ConsistentRead=True,
            )
        except CleanupError as exc:  # unknown is not "reported": say it (again, perhaps) rather than never
            log.warning("loss ledger not read; reporting the loss", extra={"error": str(exc)})
            return False
        return bool(answer and answer.get("Items"))

    def _write(self, loss: Loss) -> None:
        now = time.time()
        item: dict[str, Any] = {
            "stream": {"S": self._partition},
            "shard": {"S": loss.key},
            "why": {"S": loss.why},
            "reportedAt": {"N": str(int(now))},
            EXPIRY_ATTRIBUTE: {"N": str(math.ceil(now + LEDGER_DAYS * 86_400))},
        }
        if loss.before is not None:
            item["before"] = {"S": loss.before}
        try:
            table_call(self._dynamodb.put_item, "PutItem", self._table, TableName=self._table, Item=item)
        except CleanupError as exc:
            log.warning("loss not written to the ledger: it may be reported again", extra={"error": str(exc)})


def _fields(loss: Loss) -> dict[str, str | None]:
    return {
        "shardId": loss.shard_id,
        "afterSequenceNumber": loss.after,
        "beforeSequenceNumber": loss.before,
        "why": loss.why,
    }
