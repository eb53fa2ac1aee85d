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
  stream poller (``cleanup.inplace``): a record is given up on its MAX_RECORD_ATTEMPTS-th permanent failure, or once
  it has been failing for MAX_RECORD_RETRY_SECONDS, goes to DEAD_LETTER_QUEUE_URL and the shard moves on; with no
  queue to take it, it holds the shard, with an error and ``RecordsStuck`` on every attempt.
* A dry run (CLEANUP_MODE=dry-run) checkpoints nothing, SHARD_END included, and dead-letters nothing: each record is
  tried once and a failure reported, so the records are delivered again to the next (enforce) processor.
* The kill switch is read before every batch. Paused, ``process_records`` does not return (returning acknowledges
  the batch): it waits, reading the switch again, and the daemon keeps the shard's lease meanwhile. Turned to a dry
  run, the processor checkpoints nothing more until it is restarted: the records it only planned are delivered again
  from the last checkpoint to the processor that follows.
* stdout carries the protocol and nothing else: file descriptor 1 is handed to the protocol and then pointed at
  stderr, where logs and metrics go, so a stray print (ours or a library's) cannot corrupt the protocol.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import IO, Any

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt

from cleanup.inplace import Backoff, InPlaceBatch, consumes
from cleanup.operations.killswitch import Mode
from cleanup.pipeline import Incoming
from cleanup.runtime import Runtime
from cleanup.telemetry import log
from schemas.records import UnreadableRecord, read_kinesis_data, record_id
from worker.exit_codes import ExitCode
from worker.health import MarkingCheckpointer, MessageMarker, Watched

CHECKPOINT_TRIES = 6
RETRYABLE_CHECKPOINT_ERRORS = frozenset({"ThrottlingException", "KinesisClientLibDependencyException"})
FINAL_CHECKPOINT_ERRORS = frozenset({"ShutdownException", "InvalidStateException"})
PAUSED_POLL_SECONDS = 0.5  # how often a paused processor looks at the switch again (it answers from its cache)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No options: the daemon starts this command, and the settings come from the environment."""
    parser.epilog = "Run by the KCL MultiLangDaemon (executableName); see deploy/kcl/cleanup.properties."


def main(args: argparse.Namespace) -> int:
    """Speak the multilang protocol on stdin/stdout until the daemon closes stdin."""
    protocol = _claim_stdout()
    runtime = Runtime.from_env()  # logs go to stderr, as does everything written to fd 1 from here on
    try:
        return serve(runtime, sys.stdin, protocol)
    finally:
        runtime.close()


def serve(runtime: Runtime, input_file: IO[str], output_file: IO[str]) -> int:
    """Answer the daemon's messages read from ``input_file`` on ``output_file`` until the input ends."""
    from amazon_kclpy import kcl

    # The image's health check (``cleanup-worker health --kcl``) reads the marker of the message in hand.
    marker = MessageMarker(runtime.settings.health_file)
    process = kcl.KCLProcess(Watched(record_processor(runtime), marker), input_file=input_file, output_file=output_file)
    process.checkpointer = MarkingCheckpointer(process.checkpointer, marker)
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


class ShardProcessor:
    """Cleans one shard's records and checkpoints behind them (the methods of amazon_kclpy's v3 interface)."""

    version = 3

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.shard_id = "?"
        self.clean_through: tuple[str, int] | None = None  # the last record known clean (sequence, sub-sequence)
        self.all_clean = True  # False once a batch was left with records not clean
        self.can_checkpoint = True
        self.dry_run = not consumes(runtime.settings)  # checkpoints nothing: the records are delivered again

    # The protocol's messages.
    def initialize(self, initialize_input: Any) -> None:
        self.shard_id = initialize_input.shard_id
        log.info("shard assigned", extra={"shardId": self.shard_id, "from": initialize_input.sequence_number})
        if self.dry_run:
            log.info("dry run: no checkpoint will be written", extra={"shardId": self.shard_id})

    def process_records(self, process_records_input: Any) -> None:
        """Clean the batch, retrying in place, and checkpoint behind the clean records."""
        self._follow_switch()
        delivered = list(process_records_input.records)
        batch = InPlaceBatch([decode(record) for record in delivered], self.runtime)
        checkpointer = process_records_input.checkpointer
        while not batch.finished and self.can_checkpoint:
            attempt = batch.attempt(shardId=self.shard_id)
            if attempt.checkpoint is not None:
                last = delivered[attempt.checkpoint]
                self.clean_through = (last.sequence_number, last.sub_sequence_number)
                self._checkpoint(checkpointer, *self.clean_through)
            if not batch.finished:
                time.sleep(batch.wait())
        self.all_clean = self.all_clean and batch.finished

    def _follow_switch(self) -> None:
        """Wait while the kill switch pauses cleanup; after a batch planned under its dry run, checkpoint no more."""
        while self.runtime.refresh_mode() is Mode.PAUSED:
            time.sleep(PAUSED_POLL_SECONDS)
        if not self.dry_run and not consumes(self.runtime.settings):
            self.dry_run = True
            log.warning(
                "kill switch: dry run; no checkpoint is written any more by this processor",
                extra={"shardId": self.shard_id},
            )

    def lease_lost(self, lease_lost_input: Any) -> None:
        # Another worker owns the shard now and resumes from the last checkpoint: checkpointing is no longer allowed.
        self.can_checkpoint = False
        log.warning("lease lost; stopping without a checkpoint", extra={"shardId": self.shard_id})

    def shard_ended(self, shard_ended_input: Any) -> None:
        """Checkpoint SHARD_END, which lets the child shards start, only when every record of this shard is clean."""
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

    def shutdown_requested(self, shutdown_requested_input: Any) -> None:
        """Checkpoint what is done before the daemon shuts down."""
        if self.clean_through is not None:
            self._checkpoint(shutdown_requested_input.checkpointer, *self.clean_through)
        log.info("shutdown requested", extra={"shardId": self.shard_id, "cleanThrough": self._clean_record()})

    # Checkpoints.
    def _checkpoint(self, checkpointer: Any, sequence_number: str | None, sub_sequence_number: int | None) -> None:
        """Checkpoint, retrying throttling; after a shutdown or invalid-state answer, never checkpoint again."""
        from amazon_kclpy.checkpoint_error import CheckpointError

        if not self.can_checkpoint or self.dry_run:
            return

        def retryable(exc: BaseException) -> bool:
            return isinstance(exc, CheckpointError) and str(exc.value) in RETRYABLE_CHECKPOINT_ERRORS

        at = record_id(sequence_number, sub_sequence_number) if sequence_number is not None else None

        def throttled(state: RetryCallState) -> None:
            log.warning("checkpoint throttled; retrying", extra=self._checkpoint_line(state, at))

        retrying = Retrying(
            retry=retry_if_exception(retryable),
            stop=stop_after_attempt(CHECKPOINT_TRIES),
            wait=Backoff(self.runtime.settings),
            before_sleep=throttled,
            reraise=True,
        )
        try:
            retrying(checkpointer.checkpoint, sequence_number, sub_sequence_number)
        except CheckpointError as exc:
            extra = {"shardId": self.shard_id, "sequenceNumber": at, "error": str(exc.value)}
            if str(exc.value) in FINAL_CHECKPOINT_ERRORS:
                self.can_checkpoint = False
                log.warning("checkpointing stopped: the shard is being handed over or shut down", extra=extra)
            elif str(exc.value) in RETRYABLE_CHECKPOINT_ERRORS:
                log.error("checkpoint still throttled; the next one covers these records", extra=extra)
            else:
                log.error("checkpoint refused; the next checkpoint covers these records", extra=extra)

    def _checkpoint_line(self, state: RetryCallState, sequence_number: str | None) -> dict[str, Any]:
        error = state.outcome.exception() if state.outcome is not None else None
        return {
            "shardId": self.shard_id,
            "sequenceNumber": sequence_number,
            "error": str(getattr(error, "value", error)),
            "attempt": state.attempt_number,
        }

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
