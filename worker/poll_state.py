"""The stream poller's per-shard state, its summary, and what it does with one batch of a shard's records.

A batch is cleaned by the core (``process_batch``); a failed record is retried in place, with the records after it
that are not clean yet, and the checkpoint stops at the last record before it. A permanent failure is dead-lettered
only on its MAX_RECORD_ATTEMPTS-th attempt (a grant or socket may come back); with no dead-letter queue the shard
keeps retrying, and says so on every attempt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from cleanup.pipeline import Incoming, announce_retry, run_batch
from cleanup.retry import Deadline
from cleanup.runtime import Runtime
from cleanup.shards import Shard
from schemas.outcomes import Outcome, Status


@dataclass
class PollSummary:
    """What a run did. ``failed`` counts failed attempts: a record tried three times counts three."""

    records: int = 0
    cleaned: int = 0
    skipped: int = 0
    failed: int = 0
    dead_lettered: int = 0
    standby_polls: int = 0
    lease_lost: bool = False
    finished_shards: list[str] = field(default_factory=list)
    checkpoints: dict[str, str] = field(default_factory=dict)
    blocked: list[str] = field(default_factory=list)
    """Sequence numbers still failing, past MAX_RECORD_ATTEMPTS with no dead-letter queue, when the run ended."""
    lost: list[dict[str, str | None]] = field(default_factory=list)
    """Ranges of records trimmed from the stream before they were read (after / before sequence numbers)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Cursor:
    """Where one shard's reading stands."""

    shard: Shard
    checkpoint: str | None
    """Everything up to here is clean (written to the checkpoint table, or about to be)."""
    iterator: str | None = None
    pending: list[Incoming] = field(default_factory=list)
    """The records from the first one not clean on, to retry before reading further."""
    done: set[str] = field(default_factory=set)
    """Sequence numbers in ``pending`` already clean (or dead-lettered): not run again."""
    attempts: dict[str, int] = field(default_factory=dict)
    not_before: float = 0.0
    failures: int = 0
    drained: bool = False
    ended: bool = False
    exhausted: bool = False
    """A record past MAX_RECORD_ATTEMPTS with nowhere to dead-letter it holds the shard."""
    trimmed_after: str | None = None

    @property
    def shard_id(self) -> str:
        return self.shard.shard_id


class RecordHandler:
    """Cleans a shard's batch, dead-letters what is due, and says how far the shard is clean."""

    def __init__(
        self, runtime: Runtime, summary: PollSummary, before_checkpoint: Callable[[str, list[Outcome]], None] | None
    ) -> None:
        self.runtime = runtime
        self.summary = summary
        self.before_checkpoint = before_checkpoint

    def handle(self, cursor: Cursor, records: Sequence[Incoming]) -> str | None:
        """Run the records not yet clean; returns the new checkpoint if it moved, and leaves the rest pending."""
        todo = [record for record in records if record.sequence_number not in cursor.done]
        for record in todo:
            cursor.attempts[record.sequence_number] = cursor.attempts.get(record.sequence_number, 0) + 1
        grace = self.runtime.settings.shutdown_grace_seconds
        outcomes = run_batch(todo, self.runtime, Deadline.after(grace), attempts=cursor.attempts)
        self._count(outcomes)
        cursor.done |= {o.sequence_number for o in outcomes if not o.failed or o.dead_lettered}
        first = next((i for i, r in enumerate(records) if r.sequence_number not in cursor.done), len(records))
        cursor.pending = list(records[first:])
        waiting = {record.sequence_number for record in cursor.pending}
        cursor.done &= waiting
        cursor.attempts = {number: n for number, n in cursor.attempts.items() if number in waiting}
        failed = [o for o in outcomes if o.failed and not o.dead_lettered]
        cursor.exhausted = announce_retry(failed, cursor.attempts, self.runtime, shardId=cursor.shard_id)
        self.runtime.metrics.flush()
        if self.before_checkpoint is not None:
            self.before_checkpoint(cursor.shard_id, outcomes)
        moved = first > 0 and records[first - 1].sequence_number != cursor.checkpoint
        return records[first - 1].sequence_number if moved else None

    def _count(self, outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            if outcome.status is Status.CLEANED:
                self.summary.cleaned += 1
            elif outcome.status is Status.SKIPPED:
                self.summary.skipped += 1
            elif outcome.dead_lettered:
                self.summary.dead_lettered += 1
            else:
                self.summary.failed += 1
