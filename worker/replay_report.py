"""What a replay found and how it is shown: each record's result, the report's counts and failures, and the table or
JSON it prints as it goes (``worker.replay``)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import IO, Any

from cleanup.operations.sources import Location, Rejected
from schemas.outcomes import ActionResult, Outcome, Status


@dataclass(frozen=True, slots=True)
class Result:
    outcome: Outcome
    location: Location
    other_table: str | None = None
    """The table the record names, when it is not SESSION_TABLE."""


Row = Result | Rejected
"""A replayed record's result, or something in a file that is not a record."""


@dataclass
class Report:
    """What a replay did: counts by status, and every failure (a failed record, or something that is not one)."""

    counts: Counter[Status] = field(default_factory=Counter)
    failed: list[Result] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    foreign: int = 0
    """Records of another table than SESSION_TABLE."""
    tables: set[str] = field(default_factory=set)

    @property
    def records(self) -> int:
        return self.counts.total() + len(self.rejected)

    def add(self, results: list[Row]) -> None:
        for result in results:
            if isinstance(result, Rejected):
                self.rejected.append(result)
                continue
            self.counts[result.outcome.status] += 1
            if result.other_table is not None:
                self.foreign += 1
                self.tables.add(result.other_table)
            if result.outcome.failed:
                self.failed.append(result)

    def failures(self) -> list[dict[str, Any]]:
        """Every failed record: its sequence number and its error, prefixed by where it was found."""
        failed: list[dict[str, Any]] = [
            {"sequenceNumber": r.outcome.sequence_number, "error": f"{r.location}: {_error(r.outcome)}"}
            for r in self.failed
        ]
        failed += [{"sequenceNumber": r.sequence_number, "error": f"{r.location}: {r.error}"} for r in self.rejected]
        return failed

    def summary(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "cleaned": self.counts[Status.CLEANED],
            "planned": self.counts[Status.PLANNED],
            "skipped": self.counts[Status.SKIPPED],
            "failed": self.failures(),
        }


def _error(outcome: Outcome) -> str:
    error = outcome.error or "failed"
    return f"{error} (dead-lettered)" if outcome.dead_lettered else error


HEADER = ("SEQUENCE", "EVENT", "STATUS", "WHY", "KEY", "ACTIONS")


class Shown:
    """The report on ``out`` as the replay goes: a table's rows chunk by chunk, or one JSON object (whose ``plan``,
    in a dry run, is written record by record) once it ends."""

    def __init__(self, out: IO[str], *, as_json: bool, plan: bool) -> None:
        self.out, self.as_json, self.plan = out, as_json, plan and as_json
        self._started = False

    def rows(self, results: list[Row]) -> None:
        shown = [r for r in results if isinstance(r, Result)]
        if self.plan:
            for result in shown:
                self.out.write(("," if self._started else '{"plan": [') + json.dumps(result.outcome.summary()))
                self._started = True
        elif not self.as_json and shown:
            self._table(shown)

    def _table(self, results: list[Result]) -> None:
        rows = [] if self._started else [HEADER]
        for o in (result.outcome for result in results):
            why = o.reason.value if o.reason else (o.skip_reason or "")
            actions = "; ".join(describe(action) for action in o.actions)
            rows.append((o.sequence_number, o.event_name or "-", o.status.value, why, o.key or "-", actions or "-"))
        widths = [max(len(row[column]) for row in [HEADER, *rows]) for column in range(len(HEADER) - 1)]
        for row in rows:
            cells = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
            print(f"{cells}  {row[-1]}", file=self.out)
        self._started = True

    def end(self, report: Report) -> None:
        """The summary: the JSON object's counts and failures, or the table's failures and a summary line."""
        summary = report.summary()
        if self.as_json:
            body = json.dumps(summary)
            opening = ("]," if self._started else '{"plan": [],') if self.plan else "{"
            print(opening + body[1:], file=self.out)
            return
        failures = summary["failed"]
        if failures:
            print("\nfailed:", file=self.out)
            for failure in failures:
                print(f"  {failure['sequenceNumber'] or '?'}  {failure['error']}", file=self.out)
        planned = f"{summary['planned']} planned (dry run), " if summary["planned"] else ""
        print(
            f"\n{summary['records']} records: {summary['cleaned']} cleaned, {planned}{summary['skipped']} skipped, "
            f"{len(failures)} failed",
            file=self.out,
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
