"""``cleanup-worker drain``: drain the backlog queue from a container, as the drain function does in Lambda.

Messages are long-polled (at most 20 s a poll, under the client's read timeout), ten at a time, hidden for
``--visibility`` seconds while their records are cleaned by the same core (``cleanup.queues.backlog_drain``) within a
deadline shorter than that, at the learnt rate. A message is deleted only when its record is clean (or dead-lettered
for good), or when it is refused (its integrity tag, or its shape) and moved whole to the backlog's dead-letter
queue; the others are released with a growing visibility timeout. The loop ends on SIGTERM/SIGINT after the
batch in flight, or with ``--until-idle`` at the first empty poll; paused by the kill switch (or while it is
unknown), it waits a poll's time and asks again.
"""

from __future__ import annotations

import argparse
import json
import threading
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from cleanup.aws.aws_errors import error_code
from cleanup.aws.calls import call
from cleanup.deadline import Deadline
from cleanup.exceptions import CleanupError, MissingConfigError, TransientError
from cleanup.killswitch import Mode
from cleanup.queues.backlog_drain import SQS_BATCH, Message, clean, release
from cleanup.runtime import Runtime
from cleanup.telemetry import log
from worker import shared_options
from worker.exit_codes import ExitCode
from worker.signals import shutdown_on_signals

if TYPE_CHECKING:
    from mypy_boto3_sqs.type_defs import DeleteMessageBatchRequestEntryTypeDef

POLL_SECONDS = 20  # SQS's longest long poll
MARGIN_SECONDS = 10  # between a batch's deadline and its messages' visibility timeout


@dataclass
class DrainSummary:
    """What a drain run did, in messages."""

    received: int = 0
    done: int = 0
    released: int = 0
    polls: int = 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queue-url", help="the backlog queue (default: BACKLOG_QUEUE_URL)")
    parser.add_argument("--until-idle", action="store_true", help="stop at the first poll that finds nothing")
    parser.add_argument(
        "--visibility", type=int, default=180, help="seconds a received message is hidden while it is cleaned"
    )
    parser.add_argument("--wait", type=int, default=POLL_SECONDS, help="long-poll seconds (at most 20)")


def main(args: argparse.Namespace) -> int:
    """Drain until stopped (or idle); print the counts as one JSON line. Exit 1 if a message was left, 2 if
    misconfigured."""
    overrides = {"backlog_queue_url": args.queue_url} if args.queue_url else {}
    runtime = shared_options.runtime(args, **overrides)
    stop = threading.Event()
    try:
        if not runtime.settings.backlog_queue_url:
            raise MissingConfigError("no backlog queue: set BACKLOG_QUEUE_URL or give --queue-url")
        with shutdown_on_signals(stop.set, runtime.settings.shutdown_grace_seconds):
            summary = drain(runtime, stop, until_idle=args.until_idle, visibility=args.visibility, wait=args.wait)
    finally:
        runtime.close()
    print(json.dumps(asdict(summary)))
    return ExitCode.FAILED if summary.released else ExitCode.OK


def drain(runtime: Runtime, stop: threading.Event, *, until_idle: bool, visibility: int, wait: int) -> DrainSummary:
    """Receive, clean, delete or release, until ``stop`` is set (or, ``until_idle``, a poll finds nothing)."""
    summary = DrainSummary()
    wait = max(0, min(wait, POLL_SECONDS, int(runtime.settings.bulk_timeout_seconds) - 5))
    visibility = max(visibility, MARGIN_SECONDS + 1)
    while not stop.is_set():
        if runtime.refresh_mode() is Mode.PAUSED:
            stop.wait(wait or 1)
            continue
        messages = _receive(runtime, wait, visibility)
        summary.polls += 1
        if not messages:
            if until_idle:
                break
            continue
        summary.received += len(messages)
        deadline = Deadline.after(visibility - MARGIN_SECONDS)
        left = clean(messages, runtime, deadline)
        done = [message for message in messages if message not in left]
        _delete(runtime, done)
        release(left, runtime)
        summary.done += len(done)
        summary.released += len(left)
    return summary


def _receive(runtime: Runtime, wait: int, visibility: int) -> list[Message]:
    try:
        answer = call(
            runtime.clients.sqs.receive_message,
            "ReceiveMessage",
            None,
            QueueUrl=str(runtime.settings.backlog_queue_url),
            MaxNumberOfMessages=SQS_BATCH,
            WaitTimeSeconds=wait,
            VisibilityTimeout=visibility,
            MessageSystemAttributeNames=["ApproximateReceiveCount"],
        )
    except TransientError as exc:
        log.warning("backlog poll failed; polling again", extra={"error": str(exc)})
        return []
    except CleanupError as exc:  # a queue that is not there, or not ours to read: polling again cannot help
        if isinstance(exc.__cause__, ClientError) and "NonExistentQueue" in error_code(exc.__cause__):
            raise MissingConfigError(
                f"no such queue {runtime.settings.backlog_queue_url}: fix BACKLOG_QUEUE_URL or --queue-url"
            ) from exc
        raise
    return [Message.from_sqs(dict(message)) for message in answer.get("Messages", [])]


def _delete(runtime: Runtime, done: list[Message]) -> None:
    """Delete the done messages (one that fails to go comes back, finds its record clean, and goes then)."""
    for start in range(0, len(done), SQS_BATCH):
        entries: list[DeleteMessageBatchRequestEntryTypeDef] = [
            {"Id": str(i), "ReceiptHandle": m.receipt_handle} for i, m in enumerate(done[start : start + SQS_BATCH])
        ]
        try:
            call(
                runtime.clients.sqs.delete_message_batch,
                "DeleteMessageBatch",
                None,
                QueueUrl=str(runtime.settings.backlog_queue_url),
                Entries=entries,
            )
        except CleanupError as exc:
            log.warning("backlog messages not deleted; they come back and go then", extra={"error": str(exc)})
