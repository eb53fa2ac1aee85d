"""The stream poller's per-shard state, its summary, and what it does with one attempt at a shard's batch.

The batch is retried in place by the core (``cleanup.streams.retry_in_place``): the records not clean yet are run again,
the checkpoint stops at the last record before the first of them, and a record is given up (dead-lettered) on its
MAX_RECORD_ATTEMPTS-th permanent failure or once it has been failing for MAX_RECORD_RETRY_SECONDS. With no dead-letter
queue a record given up holds its shard, which says so on every attempt.

A shard started at LATEST has no position to come back to until it has a clean record: ``Pins`` writes the one its
reader names (``ShardReader.resume_point``) before anything is done with what it read; a dry run keeps it apart, for
the enforce run that follows (``cleanup.streams.previews``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from cleanup.deadline import Deadline
from cleanup.runtime import Runtime
from cleanup.streams.checkpointing import PollCheckpoints
from cleanup.streams.checkpoints import Checkpoint
from cleanup.streams.previews import has_place
from cleanup.streams.reader import IDLE_AFTER_EMPTY_READS, Shard, ShardReader
from cleanup.streams.retry_in_place import InPlaceBatch
from cleanup.telemetry import log
from schemas.outcomes import Outcome, Status
from schemas.settings import Settings, StartPosition

if TYPE_CHECKING:
    from mypy_boto3_dynamodbstreams import DynamoDBStreamsClient


@dataclass
class PollSummary:
    """What a run did. ``failed`` counts failed attempts: a record tried three times counts three."""

    records: int = 0
    cleaned: int = 0
    planned: int = 0
    """Sessions a dry run would have cleaned."""
    skipped: int = 0
    failed: int = 0
    deferred: int = 0
    """Records whose cleanup left only quota-bound work, sent to BACKLOG_QUEUE_URL: handled, not failed."""
    dead_lettered: int = 0
    standby_polls: int = 0
    lease_lost: bool = False
    paused: bool = False
    """A ``--until-idle`` run ended because the kill switch paused cleanup, with records left in the stream."""
    finished_shards: list[str] = field(default_factory=list)
    checkpoints: dict[str, str] = field(default_factory=dict)
    blocked: list[str] = field(default_factory=list)
    """Sequence numbers still failing and given up, with no dead-letter queue to take them, when the run ended."""
    lost: list[dict[str, str | None]] = field(default_factory=list)
    """Ranges of records trimmed from the stream before they were read (after / before sequence numbers)."""
    stream_ended: bool = False
    """Every shard of the stream is closed and read to its end (the stream was disabled), or the stream is gone."""
    stream_gone: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def add(self, other: PollSummary) -> None:
        """Count ``other`` (the run of another stream of the same table) in this one."""
        for name, value in vars(other).items():
            mine = getattr(self, name)
            if isinstance(value, bool):
                setattr(self, name, mine or value)
            elif isinstance(value, int):
                setattr(self, name, mine + value)
            elif isinstance(value, list):
                mine.extend(value)
            else:
                mine.update(value)


@dataclass
class Cursor:
    """Where one shard's reading stands."""

    shard: Shard
    checkpoint: str | None
    """Everything up to here is clean (written to the checkpoint table, or about to be; a dry run's, in memory only)."""
    reader: ShardReader
    batch: InPlaceBatch | None = None
    """The batch being retried in place, until every record of it is clean or given up; no reading before."""
    not_before: float = 0.0
    failures: int = 0
    """Failed reads in a row."""
    pinning: bool = True
    """Until its first clean checkpoint, the reader's resume point is written (``Pins``)."""
    unmarked: bool = False
    """The shard has no item in the checkpoint table yet: one is written before its first read."""
    head: str | None = None
    """Read from its start with no checkpoint: the shard's StartingSequenceNumber, until its first read is checked
    for a trimmed head (``cleanup.streams.shard_losses``)."""

    @property
    def shard_id(self) -> str:
        return self.shard.shard_id

    @property
    def exhausted(self) -> bool:
        """A record given up, with nowhere to dead-letter it, holds the shard."""
        return self.batch is not None and self.batch.stuck

    @property
    def idle(self) -> bool:
        """Nothing to do until new records arrive: drained with no batch in flight, or held by a stuck record."""
        return self.exhausted or (self.batch is None and self.reader.drained)


def shard_reader(
    streams: DynamoDBStreamsClient,
    stream_arn: str,
    shard_id: str,
    saved: Checkpoint,
    start: StartPosition,
    settings: Settings,
    *,
    limit: int | None = None,
    empty_reads_at_end: int = IDLE_AFTER_EMPTY_READS,
) -> ShardReader:
    """The poller's reader of a shard, from its checkpoint or pin (``saved``), or else from ``start``; ``limit``
    (records a read, default BATCH_SIZE) and ``empty_reads_at_end`` for readers that only count (status)."""
    return ShardReader(
        streams,
        stream_arn,
        shard_id,
        after=saved.sequence_number,
        at=saved.at,
        since=saved.since,
        start=start,
        limit=limit or settings.batch_size,
        empty_reads_at_end=empty_reads_at_end,
    )


class Pins:
    """The resume points of shards started at LATEST, written before the records read are acted on. A dry run writes
    no checkpoint: it keeps them in memory, for the reading from the checkpoints that follows a switch back to enforce
    in the same process, and as previews (``cleanup.streams.previews``), for the enforce run that follows it."""

    def __init__(self, checkpoints: PollCheckpoints) -> None:
        self._checkpoints = checkpoints
        self._unwritten: dict[str, Checkpoint] = {}

    def start(self, shard_id: str) -> Checkpoint | None:
        """Where the shard's reading starts: its checkpoint or pin, else a resume point a dry run did not write (in
        this process, or before it), else its item (a shard started, with no position yet), if any."""
        saved = self._checkpoints.saved.get(shard_id)
        if has_place(saved):
            return saved
        return self._unwritten.get(shard_id) or self._checkpoints.previews.pins.get(shard_id) or saved

    def pin(self, cursor: Cursor) -> None:
        """Write the cursor's resume point if it moved (a no-op once the shard has a clean checkpoint).

        Raises:
            TransientError: not written (the checkpoint table failed); the records read wait for it.
            LeaseLostError: another consumer owns the stream, or has checkpointed the shard further.
        """
        point = cursor.reader.resume_point() if cursor.pinning else None
        writes = self._checkpoints.writes
        known = self._checkpoints.saved.get(cursor.shard_id) if writes else self._unwritten.get(cursor.shard_id)
        if point is None or point == known:
            return
        if not self._checkpoints.save(cursor.shard_id, point, strict=True):
            self._unwritten[cursor.shard_id] = point
            if self._checkpoints.keeps_previews:
                self._checkpoints.previews.keep(cursor.shard_id, point)
        log.info(
            "shard started at LATEST pinned", extra={"shardId": cursor.shard_id, "at": point.at, "since": point.since}
        )


class BatchAttempts:
    """Runs one attempt at a shard's batch (``InPlaceBatch``), keeps the tally, and says how far the shard is clean."""

    def __init__(
        self, runtime: Runtime, summary: PollSummary, before_checkpoint: Callable[[str, list[Outcome]], None] | None
    ) -> None:
        self.runtime = runtime
        self.summary = summary
        self.before_checkpoint = before_checkpoint

    def handle(self, cursor: Cursor) -> str | None:
        """One attempt at the cursor's batch; returns the new checkpoint if it moved."""
        assert cursor.batch is not None
        grace = self.runtime.settings.shutdown_grace_seconds
        attempt = cursor.batch.attempt(Deadline.after(grace), shardId=cursor.shard_id)
        self._count(attempt.outcomes)
        if self.before_checkpoint is not None:
            self.before_checkpoint(cursor.shard_id, attempt.outcomes)
        if attempt.checkpoint is None:
            return None
        return cursor.batch.records[attempt.checkpoint].sequence_number

    def _count(self, outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            if outcome.status is Status.CLEANED:
                self.summary.cleaned += 1
            elif outcome.status is Status.PLANNED:
                self.summary.planned += 1
            elif outcome.status is Status.SKIPPED:
                self.summary.skipped += 1
            elif outcome.status is Status.DEFERRED:
                self.summary.deferred += 1
            elif outcome.dead_lettered:
                self.summary.dead_lettered += 1
            else:
                self.summary.failed += 1
