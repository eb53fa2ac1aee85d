"""The stream poller: reads every shard of a DynamoDB stream, in lineage order, and checkpoints only clean records.

A shard's step is one of: retry the records still failing, read a page, or finish the closed shard. Shards take
turns on one thread (the pipeline cleans each batch's records concurrently); a failing shard waits out its backoff
while the others go on. Everything runs under the stream's lease (``cleanup.streams.lease``); without it the poller
stands by. A dry run writes nothing, so it takes no lease and creates no table: it reads the checkpoints (if the
table exists) and runs beside the consumer that holds the lease, without delaying it. The loop's pulse
(``cleanup.streams.progress``) is the container's health and the condition of the lease's renewal. A shard started
at LATEST is pinned before its records are acted on (``shard_state.Pins``). Records the stream lost before they
were read are reported once, with their shard and range (``cleanup.streams.shard_losses``), and the age of the oldest
waiting record is published while there is still time (``cleanup.streams.record_age``). Once every shard of the
stream is closed and read, or the stream is gone, ``run()`` returns (``summary.stream_ended``):
``cleanup.streams.follow`` goes on with the table's next stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from cleanup.exceptions import StopRequested, StreamNotFoundError, TransientError
from cleanup.killswitch import Mode
from cleanup.runtime import Runtime
from cleanup.streams.checkpoint_table import table_exists
from cleanup.streams.checkpointing import PollCheckpoints
from cleanup.streams.checkpoints import Checkpoint, CheckpointStore, ensure_table
from cleanup.streams.leased import LeasedConsumer
from cleanup.streams.previews import has_place
from cleanup.streams.reader import list_shards, startable
from cleanup.streams.record_age import RecordAges, created_of, waiting_since
from cleanup.streams.retry_in_place import Backoff, InPlaceBatch, may_move_past
from cleanup.streams.shard_losses import TRIMMED, VANISHED, ShardLosses
from cleanup.streams.shard_state import BatchAttempts, Cursor, Pins, PollSummary, shard_reader
from cleanup.telemetry import log
from schemas.outcomes import Outcome
from schemas.records import Source, read_record
from schemas.settings import StartPosition

if TYPE_CHECKING:
    from mypy_boto3_dynamodbstreams import DynamoDBStreamsClient

BeforeCheckpoint = Callable[[str, list[Outcome]], None]
PAUSED_POLL_SECONDS = 0.5  # how often a paused poller looks at the switch again (it answers from its own cache)


class StreamPoller(LeasedConsumer):
    """Consumes one stream. ``run()`` returns a summary; ``request_stop()`` (any thread) ends it after the batch."""

    def __init__(
        self,
        runtime: Runtime,
        stream_arn: str,
        *,
        consumer_id: str | None = None,
        streams: DynamoDBStreamsClient | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] | None = None,
        before_checkpoint: BeforeCheckpoint | None = None,
        start_position: StartPosition | None = None,
        now: Callable[[], float] = time.time,
    ) -> None:
        """``start_position``: where a shard without a checkpoint starts (default: START_POSITION); ``now``: the
        wall clock the records' ages are read on."""
        super().__init__(runtime, stream_arn, consumer_id=consumer_id, clock=clock, sleep=sleep)
        settings = runtime.settings
        self.store = CheckpointStore(runtime.clients.dynamodb, settings.checkpoint_table, stream_arn, self.lease)
        self._streams = streams if streams is not None else runtime.clients.streams
        self._handler = BatchAttempts(runtime, self.summary, before_checkpoint)
        self._backoff = Backoff(settings)
        self._cursors: dict[str, Cursor] = {}
        self._finished: set[str] = set()
        self._start_position = start_position or settings.start_position
        latest = self._start_position is StartPosition.LATEST
        self._checkpoints = PollCheckpoints(self.store, settings, self._stopping, self._wait, latest=latest)
        self._pins = Pins(self._checkpoints)
        self._losses = ShardLosses(runtime, stream_arn, self._streams, self._checkpoints, self.summary)
        self._ages = RecordAges(runtime, health_file=settings.health_file, now=now)
        self._rediscover = True

    def run(self, *, until_idle: bool = False) -> PollSummary:
        """Stand by for the lease, then consume until stopped (or until every shard is drained, with ``until_idle``);
        a dry run reads at once, without the lease.

        Raises:
            CheckpointTableError: the checkpoint table refuses the worker (e.g. a missing permission).
        """
        self.progress.beat()
        self._ages.clear()  # what a process before this one said waits is no longer known
        try:
            dynamodb, table = self.runtime.clients.dynamodb, self.runtime.settings.checkpoint_table
            if self._dry_run:
                exists = self._checkpoints.persist("DescribeTable", lambda: table_exists(dynamodb, table))
                self._preview(until_idle, exists)
            else:
                self._checkpoints.persist("DescribeTable", lambda: ensure_table(dynamodb, table))
                self._checkpoints.keeps_previews = self._checkpoints.latest
                self._consume_under_lease(until_idle)
        except StopRequested:
            log.warning("stopped before the checkpoint table answered", extra={"consumer": self.consumer_id})
        finally:
            self.lease.release()
            self.progress.clear()
            self._ages.clear()
        return self._summarise()

    def _lease_lost(self) -> None:
        self._cursors.clear()

    def _summarise(self) -> PollSummary:
        saved = self._checkpoints.saved
        self.summary.checkpoints = {s: c.sequence_number for s, c in saved.items() if c.sequence_number}
        self.summary.blocked = [
            number for c in self._cursors.values() if c.exhausted and c.batch for number in c.batch.waiting
        ]
        return self.summary

    def _preview(self, until_idle: bool, checkpoints: bool) -> None:
        table = self.runtime.settings.checkpoint_table
        if not checkpoints:
            log.info("dry run: no checkpoint table yet; reading from START_POSITION", extra={"table": table})
            if self._checkpoints.latest:
                log.warning(
                    "dry run at LATEST with no checkpoint table keeps no place: the enforce run that follows starts "
                    "at LATEST again, after what this run reads (create the table first, or start enforce at "
                    "TRIM_HORIZON)",
                    extra={"table": table},
                )
        self._checkpoints.keeps_previews = checkpoints and self._checkpoints.latest
        log.info("dry run: reading without the stream's lease", extra={"consumer": self.consumer_id})
        self._consume(until_idle, load=checkpoints)

    # The loop.
    def _consume(self, until_idle: bool, *, load: bool = True) -> None:
        saved = self._checkpoints.load() if load else {}
        self._finished = {shard for shard, checkpoint in saved.items() if checkpoint.finished}
        next_discovery = self._clock()
        while not self._stopping.is_set():
            self.progress.beat()
            self._ages.publish()
            if self._rediscover or self._clock() >= next_discovery:
                self._discover()
                next_discovery = self._clock() + self.runtime.settings.shard_discovery_seconds
            if self.summary.stream_ended:
                break
            if until_idle and not self._rediscover and all(c.idle for c in self._cursors.values()):
                break
            ready = [c for c in self._cursors.values() if c.not_before <= self._clock()]
            if not ready:
                wake = min([c.not_before for c in self._cursors.values()] + [next_discovery])
                self._wait(wake - self._clock())
                continue
            if self._held(until_idle):
                continue
            self._ensure_lease()
            self._step(min(ready, key=lambda c: c.not_before))
        self._checkpoints.save_last((c.shard_id, c.checkpoint) for c in self._cursors.values())

    def _held(self, until_idle: bool) -> bool:
        """Whether the kill switch holds the records: paused, the poller reads and checkpoints nothing and keeps its
        lease (a ``--until-idle`` run ends). Between enforce and dry-run, reading starts again from the checkpoints:
        records a dry run only planned are read again, and cleaned, once enforce is back."""
        if self.runtime.refresh_mode() is Mode.PAUSED:
            self._ages.probe(self._cursors.values(), self._clock())
            if until_idle:
                self.summary.paused = True
                self._ages.publish(force=True)
                self._stopping.set()
            else:
                self._wait(max(self.runtime.settings.poll_interval_seconds, PAUSED_POLL_SECONDS))
            return True
        writes = may_move_past(self.runtime.settings) and not self._dry_run
        if writes != self._checkpoints.writes:
            self._checkpoints.writes = writes
            self._cursors.clear()
            saved = self._checkpoints.load()
            self._finished = {shard for shard, checkpoint in saved.items() if checkpoint.finished}
            self._rediscover = True
            return True
        return False

    def _discover(self) -> None:
        try:
            shards = list_shards(self._streams, self.stream_arn)
        except TransientError as exc:
            log.warning("DescribeStream failed; will retry", extra={"error": str(exc)})
            self._wait(self._backoff.seconds(1))
            return
        except StreamNotFoundError:
            self._stream_gone()
            return
        self._losses.forget_vanished({shard.shard_id for shard in shards}, set(self._cursors))
        if shards and all(shard.closed and shard.shard_id in self._finished for shard in shards):
            log.warning("every shard of the stream is closed and read: the stream was disabled", extra=self._about)
            self.summary.stream_ended = True
        for shard in startable(shards, self._finished, self._cursors):
            # A child shard is read from its start whatever START_POSITION says: its records follow its parent's.
            start = StartPosition.TRIM_HORIZON if shard.parent_id else self._start_position
            saved = self._pins.start(shard.shard_id)
            position = saved or Checkpoint(None)
            reader = shard_reader(
                self._streams, self.stream_arn, shard.shard_id, position, start, self.runtime.settings
            )
            unmarked = shard.shard_id not in self._checkpoints.saved  # no item of its own yet
            cursor = Cursor(shard, position.sequence_number, reader, unmarked=unmarked)
            if not has_place(saved) and start is StartPosition.TRIM_HORIZON:
                cursor.head = shard.first  # read from its start: its first read says whether its head was trimmed
            self._cursors[shard.shard_id] = cursor
            log.info("shard started", extra={"shardId": shard.shard_id, "parentShardId": shard.parent_id})
        self._rediscover = False

    # One shard's step.
    def _step(self, cursor: Cursor) -> None:
        try:
            if cursor.batch is not None:
                self._handle(cursor)
            elif cursor.reader.ended:
                self._finish(cursor)
            else:
                self._read(cursor)
        except StreamNotFoundError:
            self._left_the_stream(cursor)
        except TransientError as exc:
            cursor.failures += 1
            cursor.not_before = self._clock() + self._backoff.seconds(cursor.failures)
            log.warning("shard read failed; backing off", extra={"shardId": cursor.shard_id, "error": str(exc)})

    def _left_the_stream(self, cursor: Cursor) -> None:
        """The shard is gone (trimmed after it closed) while it was being read: whatever it still held past the last
        clean record is lost, reported; its checkpoint is forgotten and its children may start."""
        self._losses.report(cursor.shard_id, cursor.checkpoint, None, VANISHED)
        self._ages.waiting(cursor.shard_id, None)
        del self._cursors[cursor.shard_id]
        self._finished.add(cursor.shard_id)
        self._rediscover = True
        if cursor.shard_id in self._checkpoints.saved:
            self._checkpoints.forget(cursor.shard_id)

    def _read(self, cursor: Cursor) -> None:
        reader = cursor.reader
        if cursor.unmarked:  # written before its first read: a shard that vanishes unfinished is always found
            self._checkpoints.save(cursor.shard_id, Checkpoint(None), strict=True)
            cursor.unmarked = False
        page = reader.read()
        cursor.failures = 0
        if reader.gap_after is not None:
            first = page.records[0].get("dynamodb", {}).get("SequenceNumber") if page.records else None
            self._losses.report(cursor.shard_id, reader.gap_after, first, TRIMMED)
            reader.gap_after = None
        if cursor.head is not None and (page.records or reader.ended):
            self._losses.check_head(cursor, page.records)
        self._ages.waiting(cursor.shard_id, created_of(page.records[0]) if page.records else None)
        if not page.records:
            self._pins.pin(cursor)
            # Records passed over (written before a LATEST start) are no empty read: the next page is read at once.
            cursor.not_before = self._clock() + (
                self.runtime.settings.poll_interval_seconds if reader.empty_reads else 0
            )
            if reader.ended:
                self._finish(cursor)
            return
        # GetRecords records do not name their stream; Lambda adds eventSourceARN, and so do we (the table is in it).
        records = [read_record({**raw, "eventSourceARN": self.stream_arn}, Source.STREAMS) for raw in page.records]
        self.summary.records += len(records)
        cursor.batch = InPlaceBatch(records, self.runtime, self._clock)
        self._handle(cursor)

    def _handle(self, cursor: Cursor) -> None:
        assert cursor.batch is not None
        self._ensure_lease()  # again: the read before it may have outlasted the lease (a wedged call)
        self._pins.pin(cursor)  # before anything is done with the records: a LATEST start is found again
        clean_through = self._handler.handle(cursor)
        if clean_through is not None:
            cursor.checkpoint, cursor.pinning = clean_through, False
            self._checkpoints.save(cursor.shard_id, Checkpoint(clean_through))
        self._ages.waiting(cursor.shard_id, waiting_since(cursor.batch))
        if not cursor.batch.finished:
            cursor.not_before = self._clock() + cursor.batch.wait()
            return
        cursor.batch = None
        cursor.failures, cursor.not_before = 0, self._clock()
        if cursor.reader.ended:
            self._finish(cursor)

    def _finish(self, cursor: Cursor) -> None:
        self._checkpoints.save(cursor.shard_id, Checkpoint(cursor.checkpoint, finished=True), strict=True)
        self._finished.add(cursor.shard_id)
        del self._cursors[cursor.shard_id]
        self._ages.waiting(cursor.shard_id, None)
        self._rediscover = True  # its children may start now
        self.summary.finished_shards.append(cursor.shard_id)
        log.info("shard finished", extra={"shardId": cursor.shard_id, "sequenceNumber": cursor.checkpoint})

    def _stream_gone(self) -> None:
        """The stream no longer exists (24 hours after it was disabled): whatever its shards held past their
        checkpoints is lost, reported once; its checkpoints are forgotten."""
        self._losses.stream_gone({shard: cursor.checkpoint for shard, cursor in self._cursors.items()})
        for shard_id in self._cursors:
            self._ages.waiting(shard_id, None)
        self._cursors.clear()
        self.summary.stream_ended = self.summary.stream_gone = True

    @property
    def _about(self) -> dict[str, str]:
        return {"streamArn": self.stream_arn, "consumer": self.consumer_id}
