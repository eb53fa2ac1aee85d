"""``cleanup-worker redrive --queue-url URL``: clean again the batches an SQS queue says failed.

The queue holds Lambda on-failure destination messages or this worker's dead-letter messages
(``cleanup.operations.redrive`` reads both). A message is deleted only once each record it names was cleaned or was
already clean (or, for a record stored in S3, once it is known to be redriven already, or lost and reported once);
otherwise it is kept, made visible again at the end of the run, and reported with its failed, skipped and lost
records. A removal skipped (not a session, another table, another region) is judged under this run's settings, which
may not be the function's: it keeps its message, is reported with its reason, and the command exits 1. Run with the
deployed function's settings (``--function-name``), read the reasons, and only then, if they hold, pass
``--delete-skipped``.

Redrive sends nothing to the dead-letter queue: the message it is redriving already holds the failure, and keeping
it is what loses nothing. A dry run (CLEANUP_MODE=dry-run) plans every record and deletes no message and no stored
record: it reports the same split (cleaned, skipped, failed) and which messages an enforce run would delete.

A dead-letter message is redriven only once its integrity tag verifies with INTEGRITY_KEY_ID (or a key of
INTEGRITY_PREVIOUS_KEY_IDS; the operator needs kms:VerifyMac on them); one that does not, or any body neither kind of
message, is kept and reported alone.

Only SESSION_TABLE's records are sessions (a message may name any table or stream): without it the command refuses
to start.

Exit code: 0 when every message was deleted (in a dry run: would be) with its records clean, 1 when some were kept
or a stored record was reported lost, 2 on usage or configuration errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import IO, Any

from cleanup.aws.calls import call
from cleanup.exceptions import CleanupError, PermanentError
from cleanup.operations.redrive import redrive
from cleanup.operations.redrive_result import MessageResult
from cleanup.runtime import Runtime, require_session_table
from schemas.settings import CleanupMode
from worker import shared_options
from worker.exit_codes import ExitCode
from worker.progress import bar
from worker.queue_pass import depth, messages, release


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
    parser.add_argument(
        "--delete-skipped",
        action="store_true",
        help="also delete a message whose records are clean but for removals skipped (read the reasons first)",
    )
    parser.add_argument("--json", action="store_true", dest="as_json", help="print one JSON summary on stdout")


def main(args: argparse.Namespace) -> int:
    """Redrive every message on the queue with the settings from the environment."""
    runtime = shared_options.runtime(args, dead_letter_queue_url=None)
    try:
        require_session_table(runtime.settings)
        return run(args, runtime)
    finally:
        runtime.close()


@dataclass
class Report:
    messages: list[tuple[str, MessageResult]] = field(default_factory=list)
    dry_run: bool = False
    skipped_ok: bool = False

    def deletable(self, result: MessageResult) -> bool:
        return result.deletable(skipped_ok=self.skipped_ok)

    def summary(self) -> dict[str, Any]:
        kept = [(message_id, result) for message_id, result in self.messages if not self.deletable(result)]
        settled = len(self.messages) - len(kept)
        results = [result for _, result in self.messages]
        summary: dict[str, Any] = {
            "messages": len(self.messages),
            "deleted": 0 if self.dry_run else settled,
            "records": {
                "cleaned": sum(len(r.cleaned) for r in results),
                "skipped": sum(len(r.skipped) for r in results),
                "failed": sum(len(r.failed) for r in results),
                "notRemovals": sum(len(r.ignored) for r in results),
            },
            "kept": [_kept(message_id, result) for message_id, result in kept],
        }
        # Only when there are any: a stored record lost and reported (once), and duplicates of settled messages.
        lost = [{"messageId": i, "error": r.gone} for i, r in self.messages if r.gone and r.settled]
        duplicates = sum(1 for result in results if result.duplicate)
        summary.update({"reportedLost": lost} if lost else {})
        summary.update({"duplicates": duplicates} if duplicates else {})
        if self.dry_run:
            summary.update(dryRun=True, wouldDelete=settled)
        return summary


def _kept(message_id: str, result: MessageResult) -> dict[str, Any]:
    line: dict[str, Any] = {"messageId": message_id, "kind": result.kind}
    if result.error:
        line["error"] = result.error
    line["failed"] = [{"sequenceNumber": o.sequence_number, "error": o.error} for o in result.failed]
    line["skipped"] = [{"sequenceNumber": o.sequence_number, "reason": o.skip_reason} for o in result.skipped]
    line["lost"] = [{"first": lost.first, "last": lost.last, "why": lost.why} for lost in result.lost]
    if result.missing:
        line["missing"] = result.missing
    return line


def run(args: argparse.Namespace, runtime: Runtime, out: IO[str] | None = None) -> int:
    """Receive, redrive and (when clean) delete every message; then print the report."""
    out = out or sys.stdout
    sqs = runtime.clients.sqs
    dry_run = runtime.settings.cleanup_mode is CleanupMode.DRY_RUN
    report = Report(dry_run=dry_run, skipped_ok=getattr(args, "delete_skipped", False))
    kept: list[str] = []
    try:
        with bar("redrive", total=depth(sqs, args.queue_url), unit="messages", quiet=args.as_json) as progress:
            for message in messages(sqs, args.queue_url, args.wait_seconds):
                result = redrive(message.body, runtime)
                report.messages.append((message.message_id, result))
                if report.deletable(result) and not dry_run and message.receipt:
                    delete = sqs.delete_message
                    call(delete, "DeleteMessage", None, QueueUrl=args.queue_url, ReceiptHandle=message.receipt)
                else:
                    kept.append(message.receipt)
                if not args.as_json:  # each message as soon as it is done: a long redrive shows how it goes
                    progress.clear()
                    _print_message(message.message_id, result, report, out)
                progress.update()
    except CleanupError as exc:
        print(f"cleanup-worker redrive: {exc}", file=sys.stderr)
        return ExitCode.USAGE if isinstance(exc, PermanentError) and not report.messages else ExitCode.FAILED
    finally:
        release(sqs, args.queue_url, kept)
    _print(report, out, as_json=args.as_json)
    done = [result.clean or (report.skipped_ok and result.clean_but_skipped) for _, result in report.messages]
    return ExitCode.OK if all(done) else ExitCode.FAILED


def _print_message(message_id: str, result: MessageResult, report: Report, out: IO[str]) -> None:
    deletable = report.deletable(result)
    verdict = ("would be deleted" if report.dry_run else "deleted") if deletable else "kept"
    split = f"{len(result.cleaned)} cleaned, {len(result.skipped)} skipped, {len(result.failed)} failed"
    others = f", {len(result.ignored)} not removals" if result.ignored else ""
    print(f"{message_id}  {result.kind:<11}  {len(result.outcomes)} records: {split}{others}  {verdict}", file=out)
    for outcome in result.failed:
        print(f"    failed {outcome.sequence_number}: {outcome.error}", file=out)
    for outcome in result.skipped:
        print(f"    skipped {outcome.sequence_number}: {outcome.skip_reason}", file=out)
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
    records = summary["records"]
    split = f"{records['cleaned']} cleaned, {records['skipped']} skipped, {records['failed']} failed"
    print(f"\n{summary['messages']} messages: {done}, {len(summary['kept'])} kept; records: {split}", file=out)
    if records["skipped"]:
        print(
            "skipped removals keep their message: check the reasons, run with the function's settings "
            "(--function-name), and pass --delete-skipped only if the skips are right",
            file=out,
        )
