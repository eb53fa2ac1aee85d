"""What the demo (``worker.demo``) checks and prints: each session's fate against what had to happen to it, the
worker's outcome log lines it reads the reasons from, and the sweeper's and poller's summaries as sentences.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from worker.exit_codes import ExitCode

EXPECTED_REASON = {"ttl": "ttl", "explicit": "explicit", "sweep": "expired", "live": None}


@dataclass
class DemoSession:
    session_id: str
    fate: str
    tenant: str
    prefix: str
    grant_id: str
    client: Any = field(repr=False)
    objects: int = 0
    rooms: int = 0
    reason: str | None = None
    socket_closed: bool = False
    grant_retired: bool = False
    objects_left: int = 0
    rooms_left: int = 0

    @property
    def ok(self) -> bool:
        if self.fate == "live":
            untouched = not self.socket_closed and not self.grant_retired and self.objects_left == self.objects
            return untouched and self.rooms_left == self.rooms
        return (
            self.reason == EXPECTED_REASON[self.fate]
            and self.socket_closed
            and self.grant_retired
            and self.objects_left == 0
            and self.rooms_left == 0
        )


class OutcomeLog(logging.Handler):
    """Collects the worker's per-record outcome log lines (its structured logs are the demo's source of truth)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.reasons: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        key, reason = getattr(record, "key", None), getattr(record, "reason", None)
        if key and reason and getattr(record, "status", None) == "cleaned":
            self.reasons[key] = reason


def report(sessions: list[DemoSession], elapsed: float) -> int:
    """Print each session's fate against what had to happen to it, and a summary; the demo's exit code."""
    header = (
        f"{'session':<12} {'tenant':<9} {'fate':<9} {'reason':<9} {'socket':<8} {'grant':<8} {'objects':<9} "
        f"{'rooms':<7} ok"
    )
    print(header)
    print("-" * len(header))
    for s in sessions:
        objects = f"{s.objects - s.objects_left}/{s.objects}" if s.fate != "live" else f"{s.objects_left} kept"
        rooms = f"{s.rooms - s.rooms_left}/{s.rooms}" if s.fate != "live" else f"{s.rooms_left} kept"
        print(
            f"{s.session_id:<12} {s.tenant:<9} {s.fate:<9} {s.reason or '-':<9} "
            f"{'closed' if s.socket_closed else 'open':<8} {'retired' if s.grant_retired else 'active':<8} "
            f"{objects:<9} {rooms:<7} {'yes' if s.ok else 'NO'}"
        )
    bad = [s.session_id for s in sessions if not s.ok]
    cleaned = sum(1 for s in sessions if s.fate != "live" and s.ok)
    ended = sum(1 for s in sessions if s.fate != "live")
    live = sum(1 for s in sessions if s.fate == "live" and s.ok)
    removed = sum(s.rooms - s.rooms_left for s in sessions if s.fate != "live")
    kept = sum(s.rooms_left for s in sessions if s.fate == "live")
    print(
        f"\n{cleaned}/{ended} ended sessions cleaned, {live} live sessions untouched, "
        f"{len(bad)} problems, in {elapsed:.1f} s"
    )
    print(f"room registry: {removed} memberships of closed connections removed, {kept} of live ones kept")
    if bad:
        print(f"NOT CLEAN: {', '.join(bad)}")
    return ExitCode.FAILED if bad else ExitCode.OK


def sweep_line(summary: dict[str, Any]) -> str:
    """A sweep's counts as a sentence (only the counts that are not zero)."""
    counts = ", ".join(
        f"{summary[name]} {name}"
        for name in ("swept", "gone", "kept", "planned", "deferred", "failed")
        if summary.get(name)
    )
    line = f"{summary['expired']} expired sessions found in {summary['buckets']} expiry buckets"
    line += f" ({counts})" if counts else ""
    if summary.get("failedBuckets"):
        line += f"; {summary['failedBuckets']} buckets could not be read"
    return line


def poll_line(summary: dict[str, Any]) -> str:
    """A poller run's summary as a sentence."""
    line = (
        f"{summary['records']} records read: {summary['cleaned']} cleaned, {summary['skipped']} skipped, "
        f"{summary['failed']} failed attempts, {summary['dead_lettered']} dead-lettered"
    )
    if summary.get("planned"):
        line += f", {summary['planned']} planned (dry run)"
    shards = len(summary["checkpoints"])
    line += f"; checkpoints on {shards} shard{'s' if shards != 1 else ''}"
    for name in ("blocked", "lost"):
        if summary[name]:
            line += f"; {len(summary[name])} {name}"
    return line
