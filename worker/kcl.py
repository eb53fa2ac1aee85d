"""``cleanup-worker kcl``: the record processor a KCL MultiLangDaemon runs (its ``executableName``).

The daemon reads the Kinesis data stream the session table publishes its changes to (Kinesis Data Streams for
DynamoDB) and talks to this process in JSON lines over stdin/stdout, through amazon_kclpy's v3 interface. Each
record's ``data`` is a DynamoDB change record; the batch goes through the same core as every other entry point.

Guarantees, per shard:

* A record is named by its sequence number and sub-sequence number (``schemas.records.record_id``): records the
  daemon de-aggregates from one KPL record share a sequence number, and each is retried, checkpointed, dead-lettered
  and logged on its own.
* The checkpoint never passes a record that is not clean. After every attempt at a batch it moves to the last record
  before the first one still failing.
* Failed records are retried in place with backoff: amazon_kclpy acknowledges a batch even when the processor
  raises, so the processor itself must not return before its records are clean. The core's rules apply, as in the
  stream poller (``cleanup.streams.retry_in_place``): a record is given up on its MAX_RECORD_ATTEMPTS-th permanent
  failure, or once it has been failing for MAX_RECORD_RETRY_SECONDS, goes to DEAD_LETTER_QUEUE_URL and the shard moves
  on; with no queue to take it, it holds the shard, with an error and ``RecordsStuck`` on every attempt. One attempt
  runs at most SHUTDOWN_GRACE_SECONDS.
* The give-up clock survives restarts: a record's first-try time is kept in CHECKPOINT_TABLE when it first fails
  (``cleanup.streams.first_failures``), and the processor that receives it again goes on from there.
* Nothing is acknowledged uncleaned: anything raising while a message is handled, and any checkpoint refusal but a
  lost lease's or a throttle's, ends the process with the message unanswered (``exits_on_fault``). A checkpoint
  still throttled is carried by the next one; after a lost lease (``ShutdownException``) nothing is checkpointed
  and later batches are left to the shard's new owner.
* The health check (``cleanup-worker health --kcl``) reads the processor's state, marked each time it comes round:
  working towards a verdict, paused, or stuck (``worker.health``), and the arrival of its oldest waiting record.
* Losses are seen (``worker.kcl_watch``): a checkpoint older than the stream's retention, or a start at LATEST after a
  checkpoint, is ``RecordsLost`` with its range, once; the age of the oldest waiting record is published.
* A dry run (CLEANUP_MODE=dry-run) checkpoints nothing, SHARD_END included, and dead-letters nothing: each record is
  tried once and a failure reported, so the records are delivered again to the next (enforce) processor.
* The kill switch is read before every attempt, the in-place retries' included. Paused (or unknown, never read),
  ``process_records`` attempts nothing more and does not return (returning acknowledges the batch): it waits, reading
  the switch again, and the daemon keeps the shard's lease meanwhile. Turned to a dry run, the processor frees
  nothing more and checkpoints nothing more until it is restarted: the records it only planned are delivered again
  from the last checkpoint to the processor that follows.
* stdout carries the protocol and nothing else: file descriptor 1 is handed to the protocol and then pointed at
  stderr, where logs and metrics go, so a stray print (ours or a library's) cannot corrupt the protocol.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable
from typing import IO, Any, NoReturn

from cleanup.core.pipeline import Incoming
from cleanup.deadline import Deadline
from cleanup.exceptions import ConfigurationError
from cleanup.killswitch import Mode
from cleanup.runtime import Runtime
from cleanup.streams.first_failures import CLOCK, FirstFailures, GiveUpClock
from cleanup.streams.retry_in_place import InPlaceBatch, may_move_past
from cleanup.telemetry import log
from schemas.records import UnreadableRecord, read_kinesis_data, record_id
from worker import shared_options
from worker.exit_codes import ExitCode
from worker.health import PAUSED, PROGRESSING, STUCK, MessageMarker
from worker.kcl_checkpoint import CHECKPOINT_TRIES as CHECKPOINT_TRIES
from worker.kcl_checkpoint import RETRYABLE_CHECKPOINT_ERRORS, checkpoint
from worker.kcl_watch import ShardWatch

LEASE_LOST_ERROR = "ShutdownException"  # the one answer after which this processor may never checkpoint again
PAUSED_POLL_SECONDS = 0.5  # how often a paused processor looks at the switch again (it answers from its cache)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No options: the daemon starts this command, and the settings come from the environment."""
    parser.epilog = "Run by the KCL MultiLangDaemon (executableName); see deploy/kcl/cleanup.properties."


def main(args: argparse.Namespace) -> int:
    """Speak the multilang protocol on stdin/stdout until the daemon closes stdin."""
    protocol = _claim_stdout()
    runtime = shared_options.runtime(args)  # logs go to stderr, as does everything written to fd 1 from here on
    try:
        if (problem := runtime.settings.health_bound_problem()) is not None:
            raise ConfigurationError({"HEALTH_STALE_SECONDS": problem})
        return serve(runtime, sys.stdin, protocol)
    finally:
        runtime.close()


def serve(runtime: Runtime, input_file: IO[str], output_file: IO[str]) -> int:
    """Answer the daemon's messages read from ``input_file`` on ``output_file`` until the input ends."""
    from amazon_kclpy import kcl

    process = kcl.KCLProcess(record_processor(runtime), input_file=input_file, output_file=output_file)
    process.run()
    return ExitCode.OK


def _claim_stdout() -> IO[str]:
    """Keep the real stdout for the protocol, and send everything else written to fd 1 (or sys.stdout) to stderr."""
    sys.stdout.flush()
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return protocol


def record_processor(runtime: Runtime) -> Any:
    """A ``ShardProcessor`` that is also an amazon_kclpy v3 ``RecordProcessorBase`` (imported only when needed)."""
    from amazon_kclpy.v3 import processor

    class CleanupRecordProcessor(ShardProcessor, processor.RecordProcessorBase):  # type: ignore[misc]
        """The v3 record processor: every method comes from ``ShardProcessor``."""

    return CleanupRecordProcessor(runtime)


def exits_on_fault(handler: Callable[[ShardProcessor, Any], None]) -> Callable[[ShardProcessor, Any], None]:
    """A protocol message's handler that, when anything in it raises, ends the process instead of returning.

    amazon_kclpy acknowledges a message whatever its handler raises, and a batch acknowledged is never delivered
    again: the next checkpoint would pass its records. Exiting leaves the message unanswered; the daemon then stops
    (a child that dies ends the MultiLangDaemon), and the records are delivered again, from the shard's last
    checkpoint, to the processor that follows.
    """

    @functools.wraps(handler)
    def guarded(self: ShardProcessor, message: Any) -> None:
        try:
            with self.marker.working():
                handler(self, message)
        except Exception as exc:  # the message's boundary: anything unexpected ends the process, unanswered
            self._exit(f"{handler.__name__} failed: {exc!r}", exc)

    return guarded


class ShardProcessor:
    """Cleans one shard's records and checkpoints behind them (the methods of amazon_kclpy's v3 interface)."""

    version = 3

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.shard_id = "?"
        self.clean_through: tuple[str, int | None] | None = None  # the last record known clean (sequence, sub-sequence)
        self.checkpointed: tuple[str, int | None] | None = None  # the last checkpoint the daemon accepted
        self.all_clean = True  # False once a batch was left with records not clean
        self.can_checkpoint = True  # False once the lease is lost: another worker resumes from the last checkpoint
        self.dry_run = not may_move_past(runtime.settings)  # checkpoints nothing: the records are delivered again
        # The image's health check (``cleanup-worker health --kcl``) reads the marker of the message in hand.
        self.marker = MessageMarker(runtime.settings.health_file)
        self.give_up_clock = GiveUpClock(None)
        self.watch: ShardWatch | None = None

    # The protocol's messages.
    @exits_on_fault
    def initialize(self, initialize_input: Any) -> None:
        self.shard_id = initialize_input.shard_id
        log.info("shard assigned", extra={"shardId": self.shard_id, "from": initialize_input.sequence_number})
        start = initialize_input.sequence_number
        self.watch = ShardWatch(self.runtime, self.shard_id, str(start) if start else None, writes=not self.dry_run)
        if self.dry_run:
            log.info("dry run: no checkpoint will be written", extra={"shardId": self.shard_id})
            return
        settings = self.runtime.settings
        scope = settings.session_table or "-"
        store = FirstFailures(self.runtime.clients.dynamodb, settings, scope, self.shard_id)
        self.give_up_clock = GiveUpClock(store, shardId=self.shard_id)

    @exits_on_fault
    def process_records(self, process_records_input: Any) -> None:
        """Clean the batch, retrying in place, and checkpoint behind the clean records.

        After a lost lease the batch is not attempted: the shard's new owner reads it again from the last checkpoint.
        """
        delivered = list(process_records_input.records)
        behind = process_records_input.millis_behind_latest
        if self.watch is not None:
            self.watch.delivered(delivered, behind)
        if not self.can_checkpoint:
            log.warning("lease lost: batch left to the shard's new owner", extra={"shardId": self.shard_id})
            self.all_clean = self.all_clean and not delivered
            return
        batch = InPlaceBatch([decode(record) for record in delivered], self.runtime, clock=CLOCK)
        checkpointer = process_records_input.checkpointer
        grace = self.runtime.settings.shutdown_grace_seconds
        while not batch.finished and self.can_checkpoint:
            self._follow_switch()  # before every attempt: a pause or a dry run set during the retries is obeyed
            self.give_up_clock.before(batch)  # a record failing under an earlier process keeps its clock
            attempt = batch.attempt(Deadline.after(grace), shardId=self.shard_id)
            self.give_up_clock.after(batch)
            if self.watch is not None:
                self.watch.after_attempt(delivered, batch, behind)
            if attempt.checkpoint is not None:
                last = delivered[attempt.checkpoint]
                self.clean_through = (last.sequence_number, last.sub_sequence_number)
            if self.clean_through is not None and self.clean_through != self.checkpointed:
                self._checkpoint(checkpointer, *self.clean_through)  # moved, or an earlier one still to write
            if not batch.finished:
                self._wait(batch)
        self.all_clean = self.all_clean and batch.finished
        if self.watch is not None and self.checkpointed is not None and self.checkpointed == self.clean_through:
            self.watch.checkpointed(*self.checkpointed)  # how far the shard is read clean, for the next processor

    def _wait(self, batch: InPlaceBatch) -> None:
        """Wait before the next attempt, in slices, telling the health check each time where the batch stands."""
        end = time.monotonic() + batch.wait()
        while (remaining := end - time.monotonic()) > 0:
            self._report(batch)
            time.sleep(min(remaining, self._slice_seconds()))
        self._report(batch)

    def _report(self, batch: InPlaceBatch) -> None:
        """Progressing towards a verdict on each record (given up at a known moment at the latest), or stuck."""
        if batch.stuck:
            self.marker.mark(STUCK, records=batch.waiting[:5], **self._waiting())
            return
        first_tries = batch.failing_since.values()
        give_up_at = min(first_tries) + self.runtime.settings.max_record_retry_seconds if first_tries else None
        self.marker.mark(PROGRESSING, giveUpAt=give_up_at, failing=len(first_tries), **self._waiting())

    def _waiting(self) -> dict[str, Any]:
        """The oldest waiting record, for the health marker; its metric published on the way (at most a minute)."""
        if self.watch is None:
            return {}
        self.watch.ages.publish()
        return self.watch.marker_facts()

    def _slice_seconds(self) -> float:
        return min(PAUSED_POLL_SECONDS, self.runtime.settings.stale_after / 4)

    def _follow_switch(self) -> None:
        """Wait while the kill switch pauses cleanup; after a batch planned under its dry run, checkpoint no more."""
        paused = False
        while self.runtime.refresh_mode() is Mode.PAUSED:
            paused = True
            self.marker.mark(PAUSED, **self._waiting())  # paused on purpose: healthy while the stream keeps the records
            time.sleep(self._slice_seconds())
        if paused:  # else the state stands (read before every attempt, it must not hide a record stuck)
            self.marker.mark(PROGRESSING, **self._waiting())
        if not self.dry_run and not may_move_past(self.runtime.settings):
            self.dry_run = True
            self.give_up_clock = GiveUpClock(None)  # a dry run gives nothing up: the kept times wait for enforce
            log.warning(
                "kill switch: dry run; no checkpoint is written any more by this processor",
                extra={"shardId": self.shard_id},
            )

    @exits_on_fault
    def lease_lost(self, lease_lost_input: Any) -> None:
        # Another worker owns the shard now and resumes from the last checkpoint: checkpointing is no longer allowed.
        self.can_checkpoint = False
        log.warning("lease lost; stopping without a checkpoint", extra={"shardId": self.shard_id})

    @exits_on_fault
    def shard_ended(self, shard_ended_input: Any) -> None:
        """Checkpoint SHARD_END, which lets the child shards start, only when every record of this shard is clean."""
        if self.watch is not None:
            self.watch.ended()
        if self.dry_run:
            log.info("dry run: shard ended; SHARD_END not checkpointed", extra={"shardId": self.shard_id})
            return
        if not self.all_clean:
            log.error(
                "shard ended with records not clean; SHARD_END not checkpointed, the shard will be processed again",
                extra={"shardId": self.shard_id, "cleanThrough": self._clean_record()},
            )
            return
        self._checkpoint(shard_ended_input.checkpointer, None, None)
        log.info("shard ended; SHARD_END checkpointed", extra={"shardId": self.shard_id})

    @exits_on_fault
    def shutdown_requested(self, shutdown_requested_input: Any) -> None:
        """Checkpoint what is done before the daemon shuts down."""
        if self.clean_through is not None and self.clean_through != self.checkpointed:
            self._checkpoint(shutdown_requested_input.checkpointer, *self.clean_through)
        if self.watch is not None and self.checkpointed is not None:
            self.watch.checkpointed(*self.checkpointed, now=True)  # noted before the shard is handed over
        log.info("shutdown requested", extra={"shardId": self.shard_id, "cleanThrough": self._clean_record()})

    # Checkpoints.
    def _checkpoint(self, checkpointer: Any, sequence_number: str | None, sub_sequence_number: int | None) -> None:
        """Checkpoint, retrying throttling a few times; still throttled, the next checkpoint carries it.

        After a lost lease (``ShutdownException``) this processor never checkpoints again. Any other refusal
        (``InvalidStateException``, which amazon_kclpy also raises for a reply that is not a checkpoint's, or an
        error this processor does not know) ends the process: see ``exits_on_fault``.
        """
        from amazon_kclpy.checkpoint_error import CheckpointError

        if not self.can_checkpoint or self.dry_run:
            return
        at = record_id(sequence_number, sub_sequence_number) if sequence_number is not None else None
        try:
            checkpoint(checkpointer, sequence_number, sub_sequence_number, self.runtime.settings, self.shard_id)
        except CheckpointError as exc:
            extra = {"shardId": self.shard_id, "sequenceNumber": at, "error": str(exc.value)}
            if str(exc.value) == LEASE_LOST_ERROR:
                self.can_checkpoint = False
                log.warning("checkpointing stopped: the shard is being handed over or shut down", extra=extra)
            elif str(exc.value) in RETRYABLE_CHECKPOINT_ERRORS:
                log.error("checkpoint still throttled; a later one carries these records", extra=extra)
            else:
                self._exit(f"checkpoint refused ({exc.value})", exc, sequenceNumber=at)
            return
        if sequence_number is not None:
            self.checkpointed = (sequence_number, sub_sequence_number)

    def _exit(self, why: str, exc: BaseException, **extra: Any) -> NoReturn:
        """End the process, the message in hand unanswered (see ``exits_on_fault``)."""
        log.error(
            f"{why}: exiting unanswered; the records after the last checkpoint will be delivered again",
            exc_info=exc,
            extra={"shardId": self.shard_id, "checkpoint": self._checkpointed_record(), **extra},
        )
        raise SystemExit(ExitCode.FAILED) from exc

    def _checkpointed_record(self) -> str | None:
        return record_id(*self.checkpointed) if self.checkpointed else None

    def _clean_record(self) -> str | None:
        return record_id(*self.clean_through) if self.clean_through else None


def decode(record: Any) -> Incoming:
    """A Kinesis record's ``data`` (base64 JSON of a DynamoDB change record) as a stream record.

    The record is named by its sequence number and sub-sequence number (``record_id``). Anything else becomes an
    ``UnreadableRecord`` under that id: reported, never a crash. The decoding is the Lambda handler's too
    (``schemas.records.read_kinesis_data``).
    """
    sub = record.sub_sequence_number
    number = record_id(str(record.sequence_number), sub if isinstance(sub, int) and sub > 0 else None)
    try:
        return read_kinesis_data(record.data, number)
    except Exception as exc:  # the record boundary: one record must not take its batch down (amazon_kclpy would
        # acknowledge the whole batch, and the next checkpoint would pass records never cleaned)
        log.exception("record data could not be decoded", extra={"sequenceNumber": number})
        return UnreadableRecord(sequence_number=number, error=f"record data could not be decoded: {exc!r}", raw=None)
