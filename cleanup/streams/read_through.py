"""How far a KCL record processor read each shard, kept where the next processor finds it (CHECKPOINT_TABLE), so that
a checkpoint older than the stream's retention, or a start that skips records, is reported as the loss it is.

The KCL hands a shard's next processor its checkpoint, then the records after it that the stream still holds; nothing
says whether records between the two were trimmed (a Kinesis position older than the retention answers no error: the
reading starts at the oldest record left), nor whether a lease table made again at LATEST skipped some. So each
processor notes, with the checkpoints it writes (at most once every NOTE_SECONDS, and when the shard ends or is handed
over), the checkpoint and the time up to which every record of the shard is clean (``readThrough``: the arrival of the
first record still failing, or, when none is, the processor's clock less the batch's millisBehindLatest).

Items (hash key ``stream`` = ``kcl-position#<scope>``, range key ``shard`` = the shard id): ``sequenceNumber``,
``subSequenceNumber``, ``readThrough`` (epoch seconds) and ``expiresAt`` (the table's TTL attribute, a month past the
stream's retention).

A processor starting on a shard reads its item once and, with the first record delivered, decides:

* the KCL resumes from the noted checkpoint (or from TRIM_HORIZON), and the shard was read through before the trim
  horizon (now less the retention): the records after the checkpoint up to the first delivered were trimmed: lost;
* the KCL starts the shard at LATEST or at a timestamp although a checkpoint was noted: the records after it up to the
  first delivered were skipped: lost.

A table that cannot be read or written never stops the cleaning: the check is then not made, and says so.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cleanup.exceptions import CleanupError
from cleanup.streams.checkpoint_table import EXPIRY_ATTRIBUTE, ensure_table, table_call, table_call_or_gone
from cleanup.streams.losses import Loss
from cleanup.telemetry import log

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

NOTE_SECONDS = 60.0
KEEP_SECONDS = 30 * 86_400.0
SKIPPING_STARTS = frozenset({"LATEST", "AT_TIMESTAMP"})
RESUMING_STARTS = frozenset({"TRIM_HORIZON"})
TRIMMED = "the checkpoint is older than the stream's retention: the records after it were trimmed before they were read"
SKIPPED = "the KCL started the shard at {start} after a checkpoint: the records in between were never delivered"


@dataclass(frozen=True, slots=True)
class Position:
    """A shard's last noted checkpoint, and the time up to which the shard was read clean."""

    sequence_number: str
    read_through: float


class ReadThrough:
    """One shard's noted position, for one record processor."""

    def __init__(
        self,
        dynamodb: DynamoDBClient,
        table: str,
        scope: str,
        shard_id: str,
        retention_seconds: float,
        now: Callable[[], float] = time.time,
    ) -> None:
        self._dynamodb = dynamodb
        self._table = table
        self._key = {"stream": {"S": f"kcl-position#{scope}"}, "shard": {"S": shard_id}}
        self.shard_id = shard_id
        self.retention_seconds = retention_seconds
        self._now = now
        self._noted_at: float | None = None
        self._ready = False

    def recall(self) -> Position | None:
        """The position noted by an earlier processor, or None (none, no table yet, or the table failed: logged)."""
        try:
            item = table_call_or_gone(
                self._dynamodb.get_item,
                "GetItem",
                self._table,
                ("ResourceNotFoundException",),
                TableName=self._table,
                Key=self._key,
                ConsistentRead=True,
            )
        except CleanupError as exc:
            log.warning("shard position not read: a loss before this start is not looked for", extra=self._extra(exc))
            return None
        found = item.get("Item") if item is not None else None
        if not found or "sequenceNumber" not in found or "readThrough" not in found:
            return None
        return Position(found["sequenceNumber"]["S"], float(found["readThrough"]["N"]))

    def note(
        self, sequence_number: str, sub_sequence_number: int | None, read_through: float, *, now: bool = False
    ) -> None:
        """Keep the checkpoint and its read-through time, at most once every NOTE_SECONDS (at once with ``now``)."""
        clock = self._now()
        if not now and self._noted_at is not None and clock - self._noted_at < NOTE_SECONDS:
            return
        item: dict[str, Any] = {
            **self._key,
            "sequenceNumber": {"S": sequence_number},
            "subSequenceNumber": {"N": str(sub_sequence_number or 0)},
            "readThrough": {"N": repr(read_through)},
            EXPIRY_ATTRIBUTE: {"N": str(math.ceil(clock + self.retention_seconds + KEEP_SECONDS))},
        }
        try:
            self._ensure_table()
            table_call(self._dynamodb.put_item, "PutItem", self._table, TableName=self._table, Item=item)
        except CleanupError as exc:
            log.warning("shard position not noted; the next checkpoint notes it", extra=self._extra(exc))
            return
        self._noted_at = clock

    def lost_at_start(self, start: str | None, noted: Position | None, first: str | None) -> Loss | None:
        """What the KCL's start (its checkpoint, or a sentinel) lost after the noted position, before ``first``."""
        if noted is None or start is None:
            return None
        if start in SKIPPING_STARTS:
            return Loss(self.shard_id, noted.sequence_number, first, SKIPPED.format(start=start))
        horizon = self._now() - self.retention_seconds
        resumes_there = start == noted.sequence_number or start in RESUMING_STARTS
        if resumes_there and noted.read_through < horizon:
            return Loss(self.shard_id, noted.sequence_number, first, TRIMMED)
        return None

    def _ensure_table(self) -> None:
        if not self._ready:
            ensure_table(self._dynamodb, self._table)
            self._ready = True

    def _extra(self, exc: CleanupError) -> dict[str, str]:
        return {"shardId": self.shard_id, "error": str(exc)}
