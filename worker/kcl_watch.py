"""What a KCL record processor watches besides its records (``worker.kcl``): losses at its start, and the age of what
waits.

* At the first delivery after ``initialize``, the shard's noted position (``cleanup.streams.read_through``) says
  whether the KCL's start lost records: a checkpoint older than the stream's retention, or a start at LATEST after a
  checkpoint. A loss is ``RecordsLost`` with its range, reported once (``cleanup.streams.losses``).
* With each checkpoint (and each delivery, empty ones too: ``callProcessRecordsEvenForEmptyRecordList``) the
  processor notes how far the shard is read clean, for the processor that follows.
* The oldest waiting record: the first record in hand not clean yet (its arrival time), or, when every record in hand
  is clean, what ``millisBehindLatest`` says waits behind the batch. It is published (``OldestRecordAgeSeconds``,
  a WARNING past half of STREAM_RETENTION_HOURS, an ERROR four hours before it runs out) and written into the
  processor's health marker, which the health check reads (``worker.health``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from cleanup.runtime import Runtime
from cleanup.streams.losses import LossLedger
from cleanup.streams.read_through import Position, ReadThrough
from cleanup.streams.record_age import RecordAges
from cleanup.streams.retry_in_place import InPlaceBatch
from schemas.records import record_id


class ShardWatch:
    """One shard's watch, for one record processor."""

    def __init__(self, runtime: Runtime, shard_id: str, start: str | None, *, writes: bool) -> None:
        """``start``: the sequence number (or sentinel) the KCL resumes the shard from; ``writes``: not a dry run."""
        settings = runtime.settings
        dynamodb, table, scope = runtime.clients.dynamodb, settings.checkpoint_table, settings.session_table or "-"
        self.retention_seconds = settings.stream_retention_hours * 3600
        self.runtime = runtime
        self.shard_id = shard_id
        self.ages = RecordAges(runtime, retention_seconds=self.retention_seconds)
        self.writes = writes
        self._ledger = LossLedger(dynamodb, table, f"kcl#{scope}", lambda: writes)
        self._position = ReadThrough(dynamodb, table, scope, shard_id, self.retention_seconds)
        self._start = start
        self._noted: Position | None = self._position.recall()
        self._checked = False
        self.oldest_at: float | None = None
        """When the oldest record waiting arrived (epoch seconds), as the health marker carries it."""

    def delivered(self, records: Sequence[Any], millis_behind: int | None) -> None:
        """A delivery: the first one tells whether the start lost records."""
        if not self._checked:
            self._checked = True
            first = str(records[0].sequence_number) if records else None
            loss = self._position.lost_at_start(self._start, self._noted, first)
            if loss is not None:
                self._ledger.report(self.runtime, loss)
        self.after_attempt(records, None, millis_behind)

    def ended(self) -> None:
        """The shard ended (or was handed over) before any delivery: the start is judged with nothing delivered."""
        if not self._checked:
            self.delivered([], None)

    def after_attempt(self, records: Sequence[Any], batch: InPlaceBatch | None, millis_behind: int | None) -> None:
        """Where the oldest waiting record stands after an attempt at ``batch`` (None: before any)."""
        waiting = set(batch.waiting) if batch is not None else None
        self.oldest_at = None
        for record in records:
            if waiting is None or _record_id(record) in waiting:
                self.oldest_at = arrival(record)
                break
        if self.oldest_at is None and millis_behind:
            self.oldest_at = time.time() - millis_behind / 1000.0
        self.ages.waiting(self.shard_id, self.oldest_at)
        self.ages.publish()

    def checkpointed(self, sequence_number: str, sub_sequence_number: int | None, *, now: bool = False) -> None:
        """A checkpoint the daemon accepted: noted with the time up to which the shard is read clean."""
        if self.writes:
            read_through = self.oldest_at if self.oldest_at is not None else time.time()
            self._position.note(sequence_number, sub_sequence_number, read_through, now=now)

    def marker_facts(self) -> dict[str, Any]:
        """What the health marker carries about the oldest waiting record."""
        if self.oldest_at is None:
            return {}
        return {"oldestRecordAt": self.oldest_at, "retentionSeconds": self.retention_seconds}


def arrival(record: Any) -> float | None:
    """A delivered record's arrival time (epoch seconds), if it names one."""
    millis = getattr(record, "timestamp_millis", None)
    return millis / 1000.0 if isinstance(millis, int | float) and millis > 0 else None


def _record_id(record: Any) -> str:
    sub = record.sub_sequence_number
    return record_id(str(record.sequence_number), sub if isinstance(sub, int) and sub > 0 else None)
