"""What ``cleanup-worker reconcile`` reports: a verdict for each resource it listed, counted by resource.

The counts are the CLI's output, the log line and the reconcile Lambda's result (``ReconcileReport.summary``); a
dry run's report also carries its plan, what it would free.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from cleanup.actions import grant, registry, scratch

RESOURCES = (grant.ACTION, scratch.ACTION, registry.ACTION)
"""The resources reconcile lists, in the report's order."""


class Verdict(StrEnum):
    """What became of one listed resource."""

    FREED = "freed"
    GONE = "gone"  # gone already when it was to be freed
    PLANNED = "planned"  # dry run: would have been freed
    LIVE = "live"  # its session is live (or came back before the call): kept
    YOUNG = "young"  # younger than the grace period, or its age is unknown: kept
    UNCONVENTIONAL = "unconventional"  # maps to no session: never touched
    FAILED = "failed"


KEPT = (Verdict.LIVE, Verdict.YOUNG, Verdict.UNCONVENTIONAL)


@dataclass
class ReconcileReport:
    """Counts by resource and verdict."""

    mode: str
    counts: dict[str, Counter[Verdict]] = field(default_factory=lambda: {name: Counter() for name in RESOURCES})
    plan: list[dict[str, Any]] = field(default_factory=list)
    """What a dry run would free (a dry run's plan), one entry per resource."""
    stopped: str | None = None
    """Why the registry's scan stopped before its end (what was decided before stays decided), or None."""

    @property
    def ok(self) -> bool:
        return self.stopped is None and not any(counter[Verdict.FAILED] for counter in self.counts.values())

    def summary(self) -> dict[str, Any]:
        """A flat dict for the CLI's output, the log line and the Lambda's result."""
        by_resource = {
            name: {"listed": sum(counter.values()), **{verdict.value: counter[verdict] for verdict in Verdict}}
            for name, counter in self.counts.items()
        }
        stopped = {"stopped": self.stopped} if self.stopped else {}
        return {"mode": self.mode, **by_resource, **stopped, **({"plan": self.plan} if self.plan else {})}
