"""The stream poller: reads every shard of a DynamoDB stream, in lineage order, and checkpoints only clean records.

A shard's step is one of: retry the records still failing, read a page, or finish the closed shard. Shards take
turns on one thread (the pipeline cleans each batch's records concurrently); a failing shard waits out its backoff
while the others go on. Everything runs under the stream's lease (``cleanup.streams.lease``); without it the poller
stands by. A dry run writes nothing, so it takes no lease and creates no table: it reads the checkpoints (if the
table exists) and runs beside the consumer that holds the lease, without delaying it. The loop's pulse
(``cleanup.streams.progress``) is the container's health and the condition of the lease's renewal. A shard started
at LATEST is pinned before its records are acted on (``shard_state.Pins``). Once every shard of the stream is closed
and read, or the stream is gone, ``run()`` returns (``summary.stream_ended``): ``cleanup.streams.follow`` goes on
with the table's next stream.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from cleanup.core.retry_in_place import Backoff, InPlaceBatch, consumes
from cleanup.exceptions import LeaseLostError, StopRequested, StreamNotFoundError, TransientError
from cleanup.operations.killswitch import Mode
from cleanup.runtime import Runtime
from cleanup.streams.checkpoint_table import table_exists
from cleanup.streams.checkpointing import PollCheckpoints
from cleanup.streams.checkpoints import Checkpoint, CheckpointStore, ensure_table
from cleanup.streams.lease import Heartbeat, Lease, owner_name
from cleanup.streams.progress import Progress
from cleanup.streams.reader import list_shards, startable
from cleanup.streams.shard_state import BatchAttempts, Cursor, Pins, PollSummary, report_lost, shard_reader
from cleanup.telemetry import log
from schemas.outcomes import Outcome
from schemas.records import Source, read_record
from schemas.settings import StartPosition

if TYPE_CHECKING:
    from mypy_boto3_dynamodbstreams import DynamoDBStreamsClient

BeforeCheckpoint = Callable[[str, list[Outcome]], None]
PAUSED_POLL_SECONDS = 0.5  # how often a paused poller looks at the switch again (it answers from its own cache)


class StreamPoller:
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
    ) -> None:
        """``start_position``: where a shard without a checkpoint starts (default: START_POSITION)."""
        settings = runtime.settings
        self.runtime = runtime
        self.stream_arn = stream_arn
        self.consumer_id = owner_name(consumer_id)
        self.summary = PollSummary()
        self.lease = Lease(
            runtime.clients.dynamodb,
            settings.checkpoint_table,
            stream_arn,
            self.consumer_id,
            settings.lease_seconds,
            clock,
        )
        self.store = CheckpointStore(runtime.clients.dynamodb, settings.checkpoint_table, stream_arn, self.lease)
        self.progress = Progress(settings.stale_after, Path(settings.health_file), clock)
        self._streams = streams if streams is not None else runtime.clients.streams
        self._clock = clock
        self._stopping = threading.Event()
        self._sleep = sleep or self._stopping.wait
        self._handler = BatchAttempts(runtime, self.summary, before_checkpoint)
        self._backoff = Backoff(settings)
        self._cursors: dict[str, Cursor] = {}
        self._finished: set[str] = set()
        self._checkpoints = PollCheckpoints(self.store, settings, self._stopping, self._wait)
        self._pins = Pins(self._checkpoints)
        self._rediscover = True
        self._dry_run = not consumes(settings)
        self._start_position = start_position or settings.start_position

    def request_stop(self) -> None:
        """Stop after the batch in flight, its checkpoint written (safe from a signal handler)."""
        self._stopping.set()

    def run(self, *, until_idle: bool = False) -> PollSummary:
        """Stand by for the lease, then consume until stopped (or until every shard is drained, with ``until_idle``);
        a dry run reads at once, without the lease.

        Raises:
            CheckpointTableError: the checkpoint table refuses the worker (e.g. a missing permission).
        """
        self.progress.beat()
        try:
            dynamodb, table = self.runtime.clients.dynamodb, self.runtime.settings.checkpoint_table
            if self._dry_run:
                exists = self._checkpoints.persist("DescribeTable", lambda: table_exists(dynamodb, table))
                self._preview(until_idle, exists)
            else:
                self._checkpoints.persist("DescribeTable", lambda: ensure_table(dynamodb, table))
                self._consume_under_lease(until_idle)
        except StopRequested:
            log.warning("stopped before the checkpoint table answered", extra={"consumer": self.consumer_id})
        finally:
            self.lease.release()
            self.progress.clear()
        return self._summarise()

    def _consume_under_lease(self, until_idle: bool) -> None:
        while self._await_lease():
            try:
                with Heartbeat(self.lease, alive=lambda: self.progress.fresh):
                    self._consume(until_idle)
                return
            except LeaseLostError:
                log.error("lease lost: stopped consuming", extra={"consumer": self.consumer_id})
                self.summary.lease_lost = True
                self._cursors.clear()
                if until_idle:
                    return

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
        log.info("dry run: reading without the stream's lease", extra={"consumer": self.consumer_id})
        self._consume(until_idle, load=checkpoints)

    # The lease.
    def _await_lease(self) -> bool:
        standing_by = False
        while not self._stopping.is_set():
            self.progress.beat()
            try:
                if self.lease.try_acquire():
                    return True
            except TransientError as exc:
                log.warning("cannot read the lease; will retry", extra={"error": str(exc)})
            if not standing_by:
                log.info("standing by: another consumer holds the stream's lease", extra={"consumer": self.consumer_id})
                standing_by = True
            self.summary.standby_polls += 1
            self._wait(self.lease.lease_seconds / 4)
        return False

    def _ensure_lease(self) -> None:
        if self._dry_run:
            return
        if not self.lease.renew_if_due():
            raise LeaseLostError(f"{self.consumer_id} no longer holds the lease of {self.stream_arn}")

    # The loop.
    def _consume(self, until_idle: bool, *, load: bool = True) -> None:
        saved = self._checkpoints.load() if load else {}
        self._finished = {shard for shard, checkpoint in saved.items() if checkpoint.finished}
        next_discovery = self._clock()
        while not self._stopping.is_set():
            self.progress.beat()
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
            if until_idle:
                self.summary.paused = True
                self._stopping.set()
            else:
                self._wait(max(self.runtime.settings.poll_interval_seconds, PAUSED_POLL_SECONDS))
            return True
        writes = consumes(self.runtime.settings) and not self._dry_run
        if writes != self._checkpoints.writes:
            self._checkpoints.writes = writes
            self._cursors.clear()
            saved = self._checkpoints.load()
            self._finished = {shard for shard, checkpoint in saved.items() if checkpoint.finished}
            self._rediscover = True
            return True
        return False

    def _wait(self, seconds: float) -> None:
        end = self._clock() + max(0.0, seconds)
        # In slices: the lease is renewed, and the loop's pulse kept fresh, however the two bounds are set.
        slice_seconds = min(self.lease.lease_seconds / 4, self.progress.stale_after / 2)
        while not self._stopping.is_set() and (remaining := end - self._clock()) > 0:
            self.progress.beat()
            if self.lease.held:
                self._ensure_lease()
            self._sleep(min(remaining, slice_seconds))

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
        self._forget_vanished({shard.shard_id for shard in shards})
        if shards and all(shard.closed and shard.shard_id in self._finished for shard in shards):
            log.warning("every shard of the stream is closed and read: the stream was disabled", extra=self._about)
            self.summary.stream_ended = True
        for shard in startable(shards, self._finished, self._cursors):
            # A child shard is read from its start whatever START_POSITION says: its records follow its parent's.
            start = StartPosition.TRIM_HORIZON if shard.parent_id else self._start_position
            saved = self._pins.start(shard.shard_id) or Checkpoint(None)
            reader = shard_reader(self._streams, self.stream_arn, shard.shard_id, saved, start, self.runtime.settings)
            self._cursors[shard.shard_id] = Cursor(shard, saved.sequence_number, reader)
            log.info("shard started", extra={"shardId": shard.shard_id, "parentShardId": shard.parent_id})
        self._rediscover = False

    def _forget_vanished(self, listed: set[str]) -> None:
        for shard_id, saved in list(self._checkpoints.saved.items()):
            if shard_id in listed or shard_id in self._cursors:
                continue  # a shard still being read is done with when its reading ends (``_left_the_stream``)
            if not saved.finished:
                report_lost(self.runtime, self.summary, shard_id, saved.sequence_number, None)
            if not self._checkpoints.forget(shard_id):
                return  # stopping: the next consumer forgets it (and reports its loss again)

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
        report_lost(self.runtime, self.summary, cursor.shard_id, cursor.checkpoint, None)
        del self._cursors[cursor.shard_id]
        self._finished.add(cursor.shard_id)
        self._rediscover = True
        if cursor.shard_id in self._checkpoints.saved:
            self._checkpoints.forget(cursor.shard_id)

    def _read(self, cursor: Cursor) -> None:
        reader = cursor.reader
        page = reader.read()
        cursor.failures = 0
        if reader.gap_after is not None:
            first = page.records[0].get("dynamodb", {}).get("SequenceNumber") if page.records else None
            report_lost(self.runtime, self.summary, cursor.shard_id, reader.gap_after, first)
            reader.gap_after = None
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
        self._rediscover = True  # its children may start now
        self.summary.finished_shards.append(cursor.shard_id)
        log.info("shard finished", extra={"shardId": cursor.shard_id, "sequenceNumber": cursor.checkpoint})

    def _stream_gone(self) -> None:
        """The stream no longer exists (24 hours after it was disabled): whatever its shards held past their
        checkpoints is lost, reported."""
        log.error("the stream no longer exists", extra=self._about)
        unfinished = {shard: c.sequence_number for shard, c in self._checkpoints.saved.items() if not c.finished}
        unfinished.update((shard, cursor.checkpoint) for shard, cursor in self._cursors.items())
        for shard_id, after in unfinished.items():
            report_lost(self.runtime, self.summary, shard_id, after, None)
        self._cursors.clear()
        self.summary.stream_ended = self.summary.stream_gone = True

    @property
    def _about(self) -> dict[str, str]:
        return {"streamArn": self.stream_arn, "consumer": self.consumer_id}
