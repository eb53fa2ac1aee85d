"""``cleanup-worker retag --queue-url URL``: tag the worker's messages on a queue again with INTEGRITY_KEY_ID.

After a rotation of the integrity key (docs/operate.md, "Rotating the integrity key") the backlog, its dead-letter
queue and the dead-letter queue still hold messages tagged with the previous key. Each message whose tag verifies with
a key of INTEGRITY_PREVIOUS_KEY_IDS is sent again, unchanged but for a tag made with INTEGRITY_KEY_ID (and its message
attributes), and only once SQS has accepted it is the old one deleted: a message is never lost, at worst there twice
(each is cleaned idempotently). One that verifies with INTEGRITY_KEY_ID already, or a Lambda on-failure message (which
carries no tag), stays as it is; one that no accepted key verifies is reported and kept. Nothing a message names is
freed. A dry run (CLEANUP_MODE=dry-run) sends and deletes nothing and reports what it would retag.

The operator needs kms:VerifyMac on every accepted key, kms:GenerateMac on INTEGRITY_KEY_ID, and the queue's
sqs:ReceiveMessage, SendMessage, DeleteMessage and ChangeMessageVisibility (the template's ``OperatorPolicy``).

Exit code: 0 when every message of the worker on the queue now verifies with INTEGRITY_KEY_ID (in a dry run: would),
1 when some were refused or could not be retagged now, 2 on usage or configuration errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import IO, TYPE_CHECKING, Any

from cleanup.aws.calls import call
from cleanup.exceptions import CleanupError, ConfigurationError, PermanentError
from cleanup.operations.retag import Fate, Retag, retag
from cleanup.runtime import Runtime
from cleanup.telemetry import log
from schemas.settings import CleanupMode
from worker import shared_options
from worker.exit_codes import ExitCode
from worker.queue_pass import Received, messages, release

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--queue-url", required=True, help="the backlog, its dead-letter queue or the dead-letter queue"
    )
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
    """Retag every message on the queue with the settings from the environment."""
    runtime = shared_options.runtime(args, dead_letter_queue_url=None)
    try:
        if not runtime.settings.integrity_key_id:
            raise ConfigurationError({"INTEGRITY_KEY_ID": "not set: there is no key to tag the messages with"})
        return run(args, runtime)
    finally:
        runtime.close()


def run(args: argparse.Namespace, runtime: Runtime, out: IO[str] | None = None) -> int:
    """Retag every message on ``args.queue_url``; print the report; return the exit code."""
    out = out or sys.stdout
    sqs, queue = runtime.clients.sqs, args.queue_url
    dry_run = runtime.settings.cleanup_mode is CleanupMode.DRY_RUN
    counts: Counter[Fate] = Counter()
    problems: list[dict[str, Any]] = []
    kept: list[str] = []
    try:
        for message in messages(sqs, queue, args.wait_seconds, attributes=True):
            result = retag(message.body, runtime)
            if result.fate is Fate.RETAGGED and not dry_run:
                result = _replace(sqs, queue, message, result)
            counts[result.fate] += 1
            if result.fate is not Fate.RETAGGED or dry_run:
                kept.append(message.receipt)
            if result.fate in (Fate.REFUSED, Fate.ERROR):
                problems.append({"messageId": message.message_id, "fate": result.fate.value, "why": result.why})
    except CleanupError as exc:
        print(f"cleanup-worker retag: {exc}", file=sys.stderr)
        return ExitCode.USAGE if isinstance(exc, PermanentError) and not counts else ExitCode.FAILED
    finally:
        release(sqs, queue, kept)
    _print(counts, problems, dry_run, out, as_json=args.as_json)
    return ExitCode.FAILED if problems else ExitCode.OK


def _replace(sqs: SQSClient, queue: str, message: Received, result: Retag) -> Retag:
    """Send the retagged message, then delete the old one; the old one stays if the new one was not accepted."""
    try:
        call(
            sqs.send_message,
            "SendMessage",
            None,
            QueueUrl=queue,
            MessageBody=str(result.body),
            MessageAttributes=_attributes(message.attributes),
        )
    except CleanupError as exc:
        return Retag(Fate.ERROR, why=f"the retagged message was not accepted; the old one stays: {exc}")
    try:
        call(sqs.delete_message, "DeleteMessage", None, QueueUrl=queue, ReceiptHandle=message.receipt)
    except CleanupError as exc:  # both are there now: the old one verifies with the previous key, and the next
        log.warning(  # run (or the drain) finds its record as the new one left it
            "retagged message sent, the old one not deleted", extra={"messageId": message.message_id, "error": str(exc)}
        )
    return result


def _attributes(received: dict[str, Any]) -> dict[str, Any]:
    """The message attributes as SendMessage takes them (SQS answers them with empty list fields it refuses)."""
    sent = {}
    for name, value in received.items():
        if isinstance(value, dict) and isinstance(value.get("DataType"), str):
            parts = ("DataType", "StringValue", "BinaryValue")
            sent[name] = {part: value[part] for part in parts if value.get(part) is not None}
    return sent


def _print(
    counts: Counter[Fate], problems: list[dict[str, Any]], dry_run: bool, out: IO[str], *, as_json: bool
) -> None:
    summary: dict[str, Any] = {fate.value: counts[fate] for fate in Fate}
    summary.update(messages=counts.total(), problems=problems)
    if dry_run:
        summary.update(dryRun=True)
    if as_json:
        print(json.dumps(summary), file=out)
        return
    for problem in problems:
        print(f"{problem['messageId']}  {problem['fate']}: {problem['why']}", file=out)
    retagged = f"{counts[Fate.RETAGGED]} {'would be retagged (dry run)' if dry_run else 'retagged'}"
    print(
        f"{counts.total()} messages: {retagged}, {counts[Fate.CURRENT]} already with INTEGRITY_KEY_ID, "
        f"{counts[Fate.UNTAGGED]} on-failure (no tag), {counts[Fate.REFUSED]} refused, {counts[Fate.ERROR]} not "
        "now",
        file=out,
    )
