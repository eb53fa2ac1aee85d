"""``cleanup-worker replay FILE...``: clean the sessions of records saved to files, through the same core.

The files may be Lambda events, GetRecords responses, JSON lines of records (as ``capture`` writes them) or KCL
``processRecords`` messages; ``cleanup.operations.sources`` tells them apart. ``--dry-run`` plans without changing
anything: the only calls made are reads (BatchGetItem, GetBucketVersioning, the listing that counts what would be
deleted).

Only SESSION_TABLE's records are sessions (a file may name any table): without it the command refuses to start.

A SESSION_TABLE that does not exist is a configuration error (exit 2), checked before any record is read; so is a
replay whose every record names another table (each is skipped, and nothing would ever be cleaned).

Exit code: 0 when nothing failed, 1 when some records failed, 2 on usage or configuration errors (a SESSION_TABLE
that does not exist, or that no record of the replay belongs to).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from typing import IO, Any

from cleanup.aws.calls import call_or_gone
from cleanup.core.classify import item_key
from cleanup.exceptions import CleanupError, SourceFileError
from cleanup.operations.sources import Entry, FileReader, FileRecord, Rejected
from cleanup.queues.reporting import run_batch
from cleanup.runtime import Runtime, require_session_table
from schemas.outcomes import Outcome, Status
from schemas.records import StreamRecord
from schemas.settings import CleanupMode
from worker import shared_options
from worker.exit_codes import ExitCode
from worker.progress import bar
from worker.replay_report import Report, Result, Row, Shown


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files", nargs="+", metavar="FILE", help="Lambda event, GetRecords JSON, JSON lines, KCL message"
    )
    parser.add_argument("--dry-run", action="store_true", help="plan only: change nothing, show what would be done")
    parser.add_argument("--json", action="store_true", dest="as_json", help="print one JSON summary on stdout")


def main(args: argparse.Namespace) -> int:
    """Read the settings from the environment, replay the files, print the report."""
    runtime = shared_options.runtime(args, **(DRY_RUN if args.dry_run else {}))
    try:
        table = require_session_table(runtime.settings)
        if not table_exists(runtime, table):
            print(
                f"cleanup-worker replay: SESSION_TABLE {table!r} does not exist (DescribeTable): fix SESSION_TABLE "
                "(or take the function's settings with --function-name)",
                file=sys.stderr,
            )
            return ExitCode.USAGE
        return run(args, runtime)
    finally:
        runtime.close()


def table_exists(runtime: Runtime, table: str) -> bool:
    """Whether ``table`` exists; True when DynamoDB cannot say now (each record's own read then tells)."""
    dynamodb, gone = runtime.clients.dynamodb, ("ResourceNotFoundException",)
    try:
        return call_or_gone(dynamodb.describe_table, "DescribeTable", None, gone, TableName=table) is not None
    except CleanupError:
        return True


# A dry run changes nothing: it previews each step and sends nothing to the dead-letter queue or to metrics.
DRY_RUN: dict[str, Any] = {
    "cleanup_mode": CleanupMode.DRY_RUN,
    "dead_letter_queue_url": None,
    "metrics_destination": "off",
}


def run(args: argparse.Namespace, runtime: Runtime, out: IO[str] | None = None) -> int:
    """Replay ``args.files`` on ``runtime`` and print the report to ``out`` as it goes; returns the exit code.

    The files are read and cleaned a chunk at a time, and each chunk's rows are printed before the next is read:
    memory stays bounded whatever the files' size.
    """
    out = out or sys.stdout
    reader = FileReader(list(args.files))
    dry_run = runtime.settings.cleanup_mode is CleanupMode.DRY_RUN
    report = Report()
    show = Shown(out, as_json=args.as_json, plan=dry_run)
    try:
        total = reader.total_bytes
        with bar("replay", total=total, unit="B", unit_scale=True, quiet=args.as_json) as progress:
            for results in replay_chunks(reader, runtime):
                report.add(results)
                show.rows(results)
                progress.update(reader.bytes_read - progress.n)
                progress.set_postfix(records=report.records, failed=len(report.failed), refresh=False)
    except SourceFileError as exc:
        print(f"cleanup-worker replay: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    if not report.records:
        names = ", ".join(str(name) for name in args.files)
        print(f"cleanup-worker replay: no records in {names}: nothing to replay", file=sys.stderr)
        return ExitCode.USAGE
    show.end(report)
    if report.foreign == report.records:
        tables = ", ".join(repr(name) for name in sorted(report.tables))
        print(
            f"cleanup-worker replay: every record is an item of {tables}, none of SESSION_TABLE "
            f"{runtime.settings.session_table!r}: nothing was cleaned; fix SESSION_TABLE (or take the function's "
            "settings with --function-name)",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    return ExitCode.FAILED if report.failures() else ExitCode.OK


def replay(records: Iterable[Entry], runtime: Runtime, chunk: int | None = None) -> list[Result]:
    """Every record's result (``replay_chunks``, gathered: for callers that want them all at once)."""
    return [r for results in replay_chunks(records, runtime, chunk) for r in results if isinstance(r, Result)]


def replay_chunks(entries: Iterable[Entry], runtime: Runtime, chunk: int | None = None) -> Iterator[list[Row]]:
    """Run the entries through ``run_batch`` a chunk at a time, keeping each item's order across chunks; yields each
    chunk's results (and what in it could not be read) as soon as it is done."""
    chunk = chunk or max(64, runtime.settings.max_concurrency * 4)
    failed_items: dict[str, str] = {}  # item key -> sequence number of its failed record
    for batch in _chunks(entries, chunk):
        records = [entry for entry in batch if isinstance(entry, FileRecord)]
        blocked = {i: failed_items[_key(e)] for i, e in enumerate(records) if _key(e) in failed_items}
        todo = [entry for i, entry in enumerate(records) if i not in blocked]
        done = iter(run_batch([entry.record for entry in todo], runtime) if todo else [])
        results: list[Row] = [entry for entry in batch if isinstance(entry, Rejected)]
        for index, entry in enumerate(records):
            outcome = _blocked(entry, blocked[index]) if index in blocked else next(done)
            if outcome.failed and _key(entry) and _key(entry) not in failed_items:
                failed_items[_key(entry)] = outcome.sequence_number
            results.append(Result(outcome, entry.location, _other_table(entry, runtime.settings.session_table)))
        yield results


def _chunks(entries: Iterable[Entry], size: int) -> Iterator[list[Entry]]:
    """The entries in lists of ``size`` records (with whatever could not be read among them)."""
    batch: list[Entry] = []
    records = 0
    for entry in entries:
        batch.append(entry)
        records += isinstance(entry, FileRecord)
        if records >= size:
            yield batch
            batch, records = [], 0
    if batch:
        yield batch


def _other_table(entry: FileRecord, session_table: str | None) -> str | None:
    """The table ``entry``'s record names, when it is not SESSION_TABLE (None: SESSION_TABLE's, or it names none)."""
    table = entry.record.table if isinstance(entry.record, StreamRecord) else None
    return table if table is not None and table != session_table else None


def _key(entry: FileRecord) -> str:
    return item_key(entry.record) if isinstance(entry.record, StreamRecord) else ""


def _blocked(entry: FileRecord, blocker: str) -> Outcome:
    # An earlier chunk failed this item: a later record of it must not run ahead (the pipeline's rule, across chunks).
    record = entry.record
    return Outcome(
        sequence_number=record.sequence_number,
        status=Status.FAILED,
        event_id=record.event_id if isinstance(record, StreamRecord) else None,
        event_name=record.event_name if isinstance(record, StreamRecord) else None,
        key=_key(entry),
        error=f"not attempted: an earlier record of the same item ({blocker}) failed",
    )
