"""What a sweep reports: a verdict for each expired session it found, and the counts of the sweep.

The summary is the log line, the CLI's output and the sweep Lambda's result (``SweepReport.summary``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Verdict(StrEnum):
    """What became of one expired session."""

    SWEPT = "swept"  # deleted by this sweep
    KEPT = "kept"  # a heartbeat refreshed its ttl after the query: it lives on
    GONE = "gone"  # deleted by something else in between (TTL, logout, an overlapping sweep)
    PLANNED = "planned"  # dry-run: would have been deleted
    DEFERRED = "deferred"  # out of time: the next sweep takes it
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Expired:
    """An index entry whose ttl has passed: the item's key and its ttl exactly as read."""

    key: dict[str, Any]
    ttl: dict[str, str]

    @property
    def ttl_seconds(self) -> float:
        return float(self.ttl["N"])


@dataclass
class SweepReport:
    """The counts of one sweep; ``lags`` are seconds between each swept session's ttl and its delete."""

    buckets: int = 0
    failed_buckets: int = 0
    backpressure: str | None = None
    """Why sessions were left for a later sweep though time remained (SWEEP_MAX_DELETES, SWEEP_MAX_BACKLOG)."""
    verdicts: Counter[Verdict] = field(default_factory=Counter)
    lags: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed_buckets and not self.verdicts[Verdict.FAILED]

    def summary(self) -> dict[str, Any]:
        """A flat dict for the log line, the CLI's output and the Lambda's result."""
        return {
            "buckets": self.buckets,
            "failedBuckets": self.failed_buckets,
            "expired": sum(self.verdicts.values()),
            **{verdict.value: self.verdicts[verdict] for verdict in Verdict},
            "maxLagSeconds": round(max(self.lags), 3) if self.lags else None,
            **({"backpressure": self.backpressure} if self.backpressure else {}),
        }
