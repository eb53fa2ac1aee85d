"""The age of the oldest record waiting in a stream: a warning while there is still time, not a report after the loss.

A stream keeps a record for its retention (a DynamoDB stream: 24 hours; a Kinesis data stream: its
RetentionPeriodHours); a record still waiting after that is trimmed, unread. A pause, a stopped consumer or one that
falls behind is lossless only within that time. Each consumer says how old its oldest waiting record is:

* the metric ``OldestRecordAgeSeconds`` (at most once every PUBLISH_SECONDS);
* a WARNING log line past the warning age (half the retention: 12 h of a day), an ERROR past the critical age (four
  hours before the retention runs out: 20 h of a day), at most once every LOG_SECONDS;
* for the health check (``worker.health``): the stream poller writes the oldest waiting record's creation time to
  ``<HEALTH_FILE>.age``, the KCL processor into its message marker; the check notes a record past the warning age and
  fails past the critical one.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cleanup.exceptions import CleanupError
from cleanup.streams.first_failures import STREAM_RETENTION_SECONDS
from cleanup.telemetry import log

if TYPE_CHECKING:
    from cleanup.runtime import Runtime
    from cleanup.streams.retry_in_place import InPlaceBatch
    from cleanup.streams.shard_state import Cursor

METRIC = "OldestRecordAgeSeconds"
PROBE_SECONDS = 300.0
"""While a consumer reads nothing (paused), how often what waits in each shard is read apart, for its age."""
WARNING_SHARE = 0.5
"""Past this share of the retention, a waiting record is warned about (12 h of a DynamoDB stream's 24)."""
CRITICAL_MARGIN_SECONDS = 4 * 3600.0
"""This long before the retention runs out, a waiting record is critical (20 h of a DynamoDB stream's 24)."""
PUBLISH_SECONDS = 60.0
LOG_SECONDS = 900.0
AGE_SUFFIX = ".age"


def thresholds(retention_seconds: float = STREAM_RETENTION_SECONDS) -> tuple[float, float]:
    """The warning and critical ages of a waiting record, for a stream of this retention."""
    warning = retention_seconds * WARNING_SHARE
    return warning, max(warning, retention_seconds - CRITICAL_MARGIN_SECONDS)


def verdict(age: float, retention_seconds: float = STREAM_RETENTION_SECONDS) -> str | None:
    """How late a waiting record of this age is: ``critical``, ``warning``, or None."""
    warning, critical = thresholds(retention_seconds)
    return "critical" if age >= critical else "warning" if age >= warning else None


def describe(age: float, retention_seconds: float = STREAM_RETENTION_SECONDS) -> str:
    """One phrase for logs, ``status`` and the health check."""
    return (
        f"the oldest waiting record is {age / 3600:.1f} h old: the stream drops it at {retention_seconds / 3600:.0f} h"
    )


def created_of(raw: dict[str, Any] | None) -> float | None:
    """A DynamoDB stream record's creation time (epoch seconds), as GetRecords sent it; None if it names none."""
    created = (raw or {}).get("dynamodb", {}).get("ApproximateCreationDateTime")
    if isinstance(created, datetime):
        return created.timestamp()
    return float(created) if isinstance(created, int | float) else None


def waiting_since(batch: InPlaceBatch | None) -> float | None:
    """When the oldest record of ``batch`` not done yet was created (epoch seconds); None when every record is done
    (or names no time)."""
    if batch is None or batch.finished:
        return None
    first = batch.waiting[0] if batch.waiting else None
    for record in batch.records:
        if record.sequence_number == first:
            created = getattr(record, "created_at", None)
            return float(created) if isinstance(created, int | float) else None
    return None


class RecordAges:
    """The oldest waiting record of each shard a consumer reads, published for the consumer as a whole."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        retention_seconds: float = STREAM_RETENTION_SECONDS,
        health_file: str | None = None,
        now: Callable[[], float] = time.time,
    ) -> None:
        """``health_file``: where the health check finds the oldest waiting record (``<HEALTH_FILE>.age``), if any."""
        self._runtime = runtime
        self.retention_seconds = retention_seconds
        self._path = Path(f"{health_file}{AGE_SUFFIX}") if health_file else None
        self._now = now
        self._created: dict[str, float] = {}
        self._published_at: float | None = None
        self._logged_at: float | None = None
        self._probed_at: float | None = None
        self._written: float | None = -1.0  # what the health file says (never yet written)
        self._known = False  # nothing is said before a shard was read or looked at

    def waiting(self, shard_id: str, created: float | None) -> None:
        """The creation time (epoch seconds) of the oldest record waiting in ``shard_id``; None: none waits."""
        self._known = True
        if created is None:
            self._created.pop(shard_id, None)
        else:
            self._created[shard_id] = created

    def probe(self, cursors: Iterable[Cursor], clock: float) -> None:
        """While nothing is read (paused): the record waiting in each shard without a batch in hand is read apart
        (one record), at most every PROBE_SECONDS of ``clock``, since the records keep ageing meanwhile."""
        if self._probed_at is not None and clock - self._probed_at < PROBE_SECONDS:
            return
        self._probed_at = clock
        for cursor in cursors:
            if cursor.batch is not None:
                continue  # its batch in hand says how old its oldest waiting record is
            try:
                record = cursor.reader.peek()
            except CleanupError as exc:
                log.warning(
                    "cannot read what waits in the shard", extra={"shardId": cursor.shard_id, "error": str(exc)}
                )
                continue
            self.waiting(cursor.shard_id, created_of(record))

    def oldest(self) -> tuple[str, float] | None:
        """The shard whose waiting record is oldest, and that record's age (seconds), or None."""
        if not self._created:
            return None
        shard_id = min(self._created, key=self._created.__getitem__)
        return shard_id, max(0.0, self._now() - self._created[shard_id])

    def publish(self, *, force: bool = False) -> None:
        """Keep the health file current; emit the metric and warn at most once every PUBLISH_SECONDS (or now,
        ``force``)."""
        if not self._known:
            return
        oldest = self.oldest()
        created = None if oldest is None else self._created[oldest[0]]
        if created != self._written:
            self._write(created)
        now = self._now()
        if not force and self._published_at is not None and now - self._published_at < PUBLISH_SECONDS:
            return
        self._published_at = now
        age = 0.0 if oldest is None else oldest[1]
        self._runtime.metrics.observe(METRIC, age)
        self._runtime.metrics.flush()
        level = verdict(age, self.retention_seconds)
        if oldest is None or level is None:
            self._logged_at = None
            return
        if self._logged_at is None or now - self._logged_at >= LOG_SECONDS:
            self._logged_at = now
            extra = {"shardId": oldest[0], "ageSeconds": round(age), "retentionSeconds": self.retention_seconds}
            message = describe(age, self.retention_seconds) + ": clean, or resume, before it is lost"
            (log.error if level == "critical" else log.warning)(message, extra=extra)

    def clear(self) -> None:
        """The consumer has stopped: its health file says nothing any more."""
        if self._path is not None:
            with contextlib.suppress(OSError):
                self._path.unlink(missing_ok=True)

    def _write(self, created: float | None) -> None:
        self._written = created
        if self._path is None:
            return
        content = {"oldestCreatedAt": created, "retentionSeconds": self.retention_seconds}
        partial = self._path.with_name(f".{self._path.name}.partial")
        with contextlib.suppress(OSError):  # the check then knows nothing of the age: the pulse still counts
            partial.write_text(json.dumps(content))
            partial.replace(self._path)


def read_age_file(health_file: str, now: float | None = None) -> tuple[float, float] | None:
    """The health check's side: the poller's oldest waiting record's age and the stream's retention, or None."""
    try:
        content = json.loads(Path(f"{health_file}{AGE_SUFFIX}").read_text() or "{}")
    except (OSError, ValueError):
        return None
    created = content.get("oldestCreatedAt") if isinstance(content, dict) else None
    retention = content.get("retentionSeconds", STREAM_RETENTION_SECONDS) if isinstance(content, dict) else None
    if not isinstance(created, int | float) or not isinstance(retention, int | float):
        return None
    return max(0.0, (time.time() if now is None else now) - created), float(retention)
