"""``cleanup-worker replay FILE...``: clean the sessions of records saved to files, through the same core.

The files may be Lambda events, GetRecords responses, JSON lines of records (as ``capture`` writes them) or KCL
``processRecords`` messages; ``cleanup.operations.sources`` tells them apart. ``--dry-run`` plans without changing
anything: the only calls made are reads (BatchGetItem, GetBucketVersioning, the listing that counts what would be
deleted).

Exit code: 0 when nothing failed, 1 when some records failed, 2 on usage or configuration errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from cleanup.classify import item_key
from cleanup.exceptions import SourceFileError
from cleanup.operations.sources import FileRecord, Location, Rejected, read_file
from cleanup.pipeline import run_batch
from cleanup.runtime import Runtime
from schemas.outcomes import ActionResult, Outcome, Status
from schemas.records import StreamRecord
from schemas.settings import CleanupMode
from worker.exit_codes import ExitCode

PROGRESS_FROM = 500  # records; shorter files finish before a bar would help


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files", nargs="+", metavar="FILE", help="Lambda event, GetRecords JSON, JSON lines, KCL message"
    )
    parser.add_argument("--dry-run", action="store_true", help="plan only: change nothing, show what would be done")
    parser.add_argument("--json", action="store_true", dest="as_json", help="print one JSON summary on stdout")


def main(args: argparse.Namespace) -> int:
    """Read the settings from the environment, replay the files, print the report."""
    runtime = Runtime.from_env(**(DRY_RUN if args.dry_run else {}))
    try:
        return run(args, runtime)
    finally:
        runtime.close()


# A dry run changes nothing: it previews each step and sends nothing to the dead-letter queue or to metrics.
DRY_RUN: dict[str, Any] = {
    "cleanup_mode": CleanupMode.DRY_RUN,
    "dead_letter_queue_url": None,
    "metrics_destination": "off",
}


def run(args: argparse.Namespace, runtime: Runtime, out: IO[str] | None = None) -> int:
    """Replay ``args.files`` on ``runtime`` and print the report to ``out``; returns the exit code."""
    out = out or sys.stdout
    try:
        entries = [entry for path in args.files for entry in read_file(path)]
    except SourceFileError as exc:
        print(f"cleanup-worker replay: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    records = [entry for entry in entries if isinstance(entry, FileRecord)]
    report = Report(rejected=[entry for entry in entries if isinstance(entry, Rejected)])
    report.results = replay(records, runtime, Progress(len(records), sys.stderr))
    dry_run = runtime.settings.cleanup_mode is CleanupMode.DRY_RUN
    if args.as_json:
        print(json.dumps(report.summary(plan=dry_run)), file=out)
    else:
        print_table(report, out)
    return ExitCode.FAILED if report.failures() else ExitCode.OK


def replay(
    records: Sequence[FileRecord], runtime: Runtime, progress: Progress | None = None, chunk: int | None = None
) -> list[Result]:
    """Run the records through ``run_batch`` in chunks (for the progress bar), keeping each item's order across them."""
    chunk = chunk or max(64, runtime.settings.max_concurrency * 4)
    failed_items: dict[str, str] = {}  # item key -> sequence number of its failed record
    results: list[Result] = []
    for start in range(0, len(records), chunk):
        batch = records[start : start + chunk]
        blocked = {i: failed_items[_key(e)] for i, e in enumerate(batch) if _key(e) in failed_items}
        todo = [entry for i, entry in enumerate(batch) if i not in blocked]
        done = iter(run_batch([entry.record for entry in todo], runtime))
        for index, entry in enumerate(batch):
            outcome = _blocked(entry, blocked[index]) if index in blocked else next(done)
            if outcome.failed and _key(entry) and _key(entry) not in failed_items:
                failed_items[_key(entry)] = outcome.sequence_number
            results.append(Result(outcome, entry.location))
        if progress:
            progress.advance(len(batch))
    if progress:
        progress.close()
    return results


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


@dataclass(frozen=True, slots=True)
class Result:
    outcome: Outcome
    location: Location


@dataclass
class Report:
    """The outcomes of a replay, and what in the files could not be processed at all."""

    rejected: list[Rejected]
    results: list[Result] = field(default_factory=list)

    def count(self, status: Status) -> int:
        return sum(1 for result in self.results if result.outcome.status is status)

    def failures(self) -> list[dict[str, Any]]:
        """Every failed record: its sequence number and its error, prefixed by where it was found."""
        failed: list[dict[str, Any]] = [
            {"sequenceNumber": r.outcome.sequence_number, "error": f"{r.location}: {_error(r.outcome)}"}
            for r in self.results
            if r.outcome.failed
        ]
        failed += [{"sequenceNumber": r.sequence_number, "error": f"{r.location}: {r.error}"} for r in self.rejected]
        return failed

    def summary(self, *, plan: bool = False) -> dict[str, Any]:
        line: dict[str, Any] = {
            "records": len(self.results) + len(self.rejected),
            "cleaned": self.count(Status.CLEANED),
            "planned": self.count(Status.PLANNED),
            "skipped": self.count(Status.SKIPPED),
            "failed": self.failures(),
        }
        if plan:
            line["plan"] = [r.outcome.summary() for r in self.results]
        return line


def _error(outcome: Outcome) -> str:
    error = outcome.error or "failed"
    return f"{error} (dead-lettered)" if outcome.dead_lettered else error


def print_table(report: Report, out: IO[str]) -> None:
    """One row per record (sequence number, event, status, why, key, actions), then the failures and a summary."""
    rows = [("SEQUENCE", "EVENT", "STATUS", "WHY", "KEY", "ACTIONS")]
    for result in report.results:
        o = result.outcome
        why = o.reason.value if o.reason else (o.skip_reason or "")
        actions = "; ".join(describe(action) for action in o.actions)
        rows.append((o.sequence_number, o.event_name or "-", o.status.value, why, o.key or "-", actions or "-"))
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1], file=out)
    failures = report.failures()
    if failures:
        print("\nfailed:", file=out)
        for failure in failures:
            print(f"  {failure['sequenceNumber'] or '?'}  {failure['error']}", file=out)
    summary = report.summary()
    planned = f"{summary['planned']} planned (dry run), " if summary["planned"] else ""
    print(
        f"\n{summary['records']} records: {summary['cleaned']} cleaned, {planned}{summary['skipped']} skipped, "
        f"{len(failures)} failed",
        file=out,
    )


def describe(action: ActionResult) -> str:
    """An action in a few words: what it acts on, how much, and its status (or why the guard refused it)."""
    detail = action.detail
    target = {
        "connection": f"close {detail.get('connectionId')}",
        "grant": f"retire {detail.get('grantId')}" + (f" on {detail['keyId']}" if detail.get("keyId") else ""),
        "scratch": f"delete {_s3_url(detail)}",
        "registry": f"remove {detail.get('connectionId')} from {detail.get('table')}",
    }.get(action.action, action.action)
    counts = ", ".join(f"{detail[name]} {name}" for name in ("objects", "versions", "memberships") if name in detail)
    status = "refused" if detail.get("refused") else action.status.value
    text = f"{target}{f' ({counts})' if counts else ''}: {status}"
    return f"{text}: {action.error}" if action.error else text


def _s3_url(detail: dict[str, Any]) -> str:
    bucket = detail.get("bucket")
    return f"s3://{bucket}/{detail.get('prefix')}" if bucket else str(detail.get("prefix"))


class Progress:
    """A one-line progress bar on a terminal; silent when the stream is not one or the work is short."""

    def __init__(self, total: int, stream: IO[str], width: int = 30) -> None:
        self.total, self.done, self.width, self.stream = total, 0, width, stream
        self.enabled = total >= PROGRESS_FROM and stream.isatty()

    def advance(self, count: int) -> None:
        self.done += count
        if self.enabled:
            filled = self.width * self.done // self.total
            bar = "#" * filled + "." * (self.width - filled)
            self.stream.write(f"\rreplay [{bar}] {self.done}/{self.total} records")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
