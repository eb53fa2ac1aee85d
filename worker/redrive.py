"""``cleanup-worker redrive --queue-url URL``: clean again the batches an SQS queue says failed.

The queue holds Lambda on-failure destination messages or this worker's dead-letter messages
(``cleanup.operations.redrive`` reads both). A message is deleted only once every record it names is clean
(or, for a record stored in S3, once it is known to be redriven already, or lost and reported once); otherwise it is
kept, made visible again at the end of the run, and reported with its failed and lost records.
Redrive sends nothing to the dead-letter queue: the message it is redriving already holds the failure, and keeping
it is what loses nothing. A dry run (CLEANUP_MODE=dry-run) plans every record and deletes no message and no stored
record: it reports which messages an enforce run would delete.

A dead-letter message is redriven only once its integrity tag verifies with INTEGRITY_KEY_ID (the operator needs
kms:VerifyMac on that key); one that does not, or any body neither kind of message, is kept and reported alone.

Only SESSION_TABLE's records are sessions (a message may name any table or stream): without it the command refuses
to start.

Exit code: 0 when every message was deleted (in a dry run: would be) with its records clean, 1 when some were kept
or a stored record was reported lost, 2 on usage or configuration errors.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from cleanup.aws.calls import call
from cleanup.exceptions import CleanupError, PermanentError
from cleanup.operations.redrive import MessageResult, redrive
from cleanup.runtime import Runtime, require_session_table
from schemas.settings import CleanupMode
from worker.exit_codes import ExitCode
from worker.progress import bar

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageTypeDef


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queue-url", required=True, help="SQS queue of on-failure or dead-letter messages")
    parser.add_argument(
        "--wait-seconds",
        type=int,
        default=1,
        choices=range(21),
        metavar="0-20",
        help="SQS long-poll wait; the run ends at the first receive that brings nothing new",
    )
    parser.add_argument("--json", action="store_true", dest="as_json", help="print one JSON summary on stdout")


def main(args: argparse.Namespace) -> int:
    """Redrive every message on the queue with the settings from the environment."""
    runtime = Runtime.from_env(dead_letter_queue_url=None)
    try:
        require_session_table(runtime.settings)
        return run(args, runtime)
    finally:
        runtime.close()


@dataclass
class Report:
    messages: list[tuple[str, MessageResult]] = field(default_factory=list)
    dry_run: bool = False

    def summary(self) -> dict[str, Any]:
        kept = [(message_id, result) for message_id, result in self.messages if not result.settled]
        settled = len(self.messages) - len(kept)
        summary: dict[str, Any] = {
            "messages": len(self.messages),
            "deleted": 0 if self.dry_run else settled,
            "kept": [_kept(message_id, result) for message_id, result in kept],
        }
        # Only when there are any: a stored record lost and reported (once), and duplicates of settled messages.
        lost = [{"messageId": i, "error": r.gone} for i, r in self.messages if r.gone and r.settled]
        duplicates = sum(1 for _, result in self.messages if result.duplicate)
        summary.update({"reportedLost": lost} if lost else {})
        summary.update({"duplicates": duplicates} if duplicates else {})
        if self.dry_run:
            summary.update(dryRun=True, wouldDelete=settled)
        return summary


def _kept(message_id: str, result: MessageResult) -> dict[str, Any]:
    line: dict[str, Any] = {"messageId": message_id, "kind": result.kind}
    if result.error:
        line["error"] = result.error
    line["failed"] = [{"sequenceNumber": o.sequence_number, "error": o.error} for o in result.outcomes if o.failed]
    line["lost"] = [{"first": lost.first, "last": lost.last, "why": lost.why} for lost in result.lost]
    if result.missing:
        line["missing"] = result.missing
    return line


def run(args: argparse.Namespace, runtime: Runtime, out: IO[str] | None = None) -> int:
    """Receive, redrive and (when clean) delete every message; then print the report."""
    out = out or sys.stdout
    sqs = runtime.clients.sqs
    report = Report(dry_run=runtime.settings.cleanup_mode is CleanupMode.DRY_RUN)
    kept: list[str] = []
    total = _depth(sqs, args.queue_url)
    try:
        with bar("redrive", total=total, unit="messages", quiet=args.as_json) as progress:
            for message in _messages(sqs, args.queue_url, args.wait_seconds):
                result = redrive(message["Body"], runtime)
                report.messages.append((message["MessageId"], result))
                if result.settled and not report.dry_run:
                    receipt = message["ReceiptHandle"]
                    call(sqs.delete_message, "DeleteMessage", None, QueueUrl=args.queue_url, ReceiptHandle=receipt)
                else:
                    kept.append(message["ReceiptHandle"])
                if not args.as_json:  # each message as soon as it is done: a long redrive shows how it goes
                    progress.clear()
                    _print_message(message["MessageId"], result, report.dry_run, out)
                progress.update()
    except CleanupError as exc:
        print(f"cleanup-worker redrive: {exc}", file=sys.stderr)
        return ExitCode.USAGE if isinstance(exc, PermanentError) and not report.messages else ExitCode.FAILED
    finally:
        _release(sqs, args.queue_url, kept)
    _print(report, out, as_json=args.as_json)
    return ExitCode.FAILED if any(not result.clean for _, result in report.messages) else ExitCode.OK


def _messages(sqs: SQSClient, queue_url: str, wait_seconds: int) -> Iterator[MessageTypeDef]:
    """Every message on the queue once: stops at the first receive that brings none not already seen."""
    seen: set[str] = set()
    while True:
        answer = call(
            sqs.receive_message,
            "ReceiveMessage",
            None,
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=wait_seconds,
        )
        fresh = [m for m in answer.get("Messages", []) if m["MessageId"] not in seen]
        if not fresh:
            return
        for message in fresh:
            seen.add(message["MessageId"])
            yield message


def _release(sqs: SQSClient, queue_url: str, receipts: list[str]) -> None:
    # Kept messages are made visible again now, so that the next run (or a person) sees them at once.
    # A failure here is harmless: the message becomes visible anyway when its visibility timeout ends.
    for receipt in receipts:
        with contextlib.suppress(CleanupError):
            call(
                sqs.change_message_visibility,
                "ChangeMessageVisibility",
                None,
                QueueUrl=queue_url,
                ReceiptHandle=receipt,
                VisibilityTimeout=0,
            )


def _depth(sqs: SQSClient, queue_url: str) -> int | None:
    """How many messages the queue holds, for the progress bar's ETA (None if it cannot be asked)."""
    try:
        answer = call(
            sqs.get_queue_attributes,
            "GetQueueAttributes",
            None,
            QueueUrl=queue_url,
            AttributeNames=["ApproximateNumberOfMessages"],
        )
    except CleanupError:
        return None
    depth = str(answer.get("Attributes", {}).get("ApproximateNumberOfMessages", ""))
    return int(depth) if depth.isdigit() else None


def _print_message(message_id: str, result: MessageResult, dry_run: bool, out: IO[str]) -> None:
    cleaned = sum(1 for o in result.outcomes if not o.failed)
    verdict = ("would be deleted" if dry_run else "deleted") if result.settled else "kept"
    print(f"{message_id}  {result.kind:<11}  {len(result.outcomes)} records, {cleaned} clean  {verdict}", file=out)
    for outcome in result.outcomes:
        if outcome.failed:
            print(f"    failed {outcome.sequence_number}: {outcome.error}", file=out)
    for lost in result.lost:
        print(f"    lost {lost.first}..{lost.last}: {lost.why}", file=out)
    for note in (result.duplicate, result.gone, result.error):
        if note:
            print(f"    {note}", file=out)
    out.flush()


def _print(report: Report, out: IO[str], *, as_json: bool) -> None:
    """The end of the report: the JSON summary, or (the messages being printed already) the totals."""
    summary = report.summary()
    if as_json:
        print(json.dumps(summary), file=out)
        return
    if report.dry_run:
        done = f"dry run, nothing deleted: {summary['wouldDelete']} would be deleted"
    else:
        done = f"{summary['deleted']} deleted"
    print(f"\n{summary['messages']} messages: {done}, {len(summary['kept'])} kept", file=out)
