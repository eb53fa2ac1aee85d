"""Structured logs and CloudWatch embedded-metric-format (EMF) metrics, to a stream the entry point chooses.

In Lambda both go to stdout, where CloudWatch Logs picks up EMF. In a container stdout may be a protocol channel (the
KCL MultiLangDaemon talks to its child over it), so logs and metrics go to stderr there, or metrics to a CloudWatch
agent's EMF endpoint (``tcp://`` or ``udp://``). This module does it itself, in under two hundred lines: Powertools'
Metrics prints to stdout only, and aws-embedded-metrics writes to stdout or to an agent's socket, never to stderr
(and both pull in more than a cold start should pay for).

With LOG_IDENTIFIERS=hashed, the fields that name a session's resources are logged hashed
(``cleanup.log_identifiers``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, Any
from urllib.parse import urlsplit

from cleanup.log_identifiers import IDENTIFIER_FIELDS, Hasher, hide_identifiers, identifier_hasher
from schemas.convention import CANARY_TENANT
from schemas.outcomes import Outcome, Status
from schemas.settings import Settings

LOGGER_NAME = "cleanup"
log = logging.getLogger(LOGGER_NAME)

_STANDARD_ATTRS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}

__all__ = [
    "IDENTIFIER_FIELDS",
    "LOGGER_NAME",
    "METRICS",
    "Hasher",
    "JsonFormatter",
    "Metric",
    "Metrics",
    "MetricsSink",
    "configure_logging",
    "hide_identifiers",
    "identifier_hasher",
    "in_lambda",
    "log",
    "log_outcomes",
]


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, service, message, and whatever ``extra`` carried (identifiers hashed
    by ``hasher``, when given)."""

    def __init__(self, service: str, hasher: Hasher | None = None) -> None:
        super().__init__()
        self.service = service
        self.hasher = hasher

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "service": self.service,
            "message": record.getMessage(),
        }
        line.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD_ATTRS})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if self.hasher is not None:
            line = hide_identifiers(json.loads(json.dumps(line, default=str)), self.hasher)
        return json.dumps(line, default=str)


def in_lambda() -> bool:
    return "AWS_LAMBDA_FUNCTION_NAME" in os.environ


def configure_logging(settings: Settings, stream: IO[str] | None = None) -> None:
    """Send the worker's logs, as JSON lines, to ``stream`` (stdout in Lambda, stderr elsewhere)."""
    handler = logging.StreamHandler(stream or (sys.stdout if in_lambda() else sys.stderr))
    handler.setFormatter(JsonFormatter(settings.service_name, identifier_hasher(settings)))
    log.handlers[:] = [handler]
    log.setLevel(settings.log_level.upper())
    log.propagate = False


class MetricsSink:
    """Where EMF documents go: a text stream, a CloudWatch agent socket, or nowhere."""

    def __init__(self, destination: str, stream: IO[str] | None = None) -> None:
        """``stream`` stands in for stdout or stderr (for tests and embedding)."""
        self._lock = threading.Lock()
        self._stream: IO[str] | None = None
        self._address: tuple[str, str, int] | None = None
        if destination == "auto":
            destination = "stdout" if in_lambda() else "stderr"
        if destination in ("stdout", "stderr"):
            self._stream = stream or (sys.stdout if destination == "stdout" else sys.stderr)
        elif destination != "off":
            url = urlsplit(destination)
            if url.scheme not in ("tcp", "udp") or not url.hostname or not url.port:
                raise ValueError(
                    f"METRICS_DESTINATION must be stdout, stderr, off or tcp/udp://host:port: {destination!r}"
                )
            self._address = (url.scheme, url.hostname, url.port)

    def write(self, documents: Iterable[dict[str, Any]]) -> None:
        lines = [json.dumps(doc, separators=(",", ":")) for doc in documents]
        if not lines:
            return
        with self._lock:
            if self._stream is not None:
                self._stream.write("\n".join(lines) + "\n")
                self._stream.flush()
            elif self._address is not None:
                self._send(lines)

    def _send(self, lines: list[str]) -> None:
        assert self._address is not None
        scheme, host, port = self._address
        try:
            if scheme == "udp":
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                    for line in lines:
                        sock.sendto((line + "\n").encode(), (host, port))
            else:
                with socket.create_connection((host, port), timeout=2) as sock:
                    sock.sendall(("\n".join(lines) + "\n").encode())
        except OSError as exc:  # metrics must never fail a cleanup
            log.warning("metrics agent unreachable", extra={"error": str(exc)})


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric the worker emits: its name, its dimension besides ``Service`` (if any), and what it means."""

    name: str
    dimension: str
    meaning: str


METRICS: tuple[Metric, ...] = (
    Metric("SessionsCleaned", "Reason (ttl, expired, explicit)", "sessions whose resources are all freed"),
    Metric("TtlLagSeconds", "", "TTL deletes: the record's time minus the item's ttl (how late DynamoDB TTL was)"),
    Metric("RecordsSkipped", "", "INSERT, MODIFY, and REMOVEs of items that are not sessions"),
    Metric("RecordsFailed", "", "records reported failed (to be retried)"),
    Metric("RecordsDeadLettered", "", "records sent to the dead-letter queue"),
    Metric(
        "ActionFailures",
        "Action (each action kind: connection, grant, scratch, registry, http-close, an installed kind's name); also "
        "emitted without it (Service alone: every kind summed, what ActionFailuresAlarm watches)",
        "failed actions",
    ),
    Metric(
        "ResourcesUnbound",
        "Action (grant, scratch)",
        "SESSION_BINDING: grants and scratch prefixes kept as not bound to their session (a dry run counts those it "
        "would keep)",
    ),
    Metric(
        "Retries",
        "Action",
        "transient errors retried by the worker (botocore's own retries come first, except for the calls that free "
        "something, which the worker retries after a fresh read)",
    ),
    Metric("RecordsRetried", "", "containers: records retried in place"),
    Metric("RecordsStuck", "", "containers: records given up with no dead-letter queue to take them"),
    Metric(
        "RecordsLost",
        "",
        "containers: records no reader can read any more (trimmed, or their shard or stream gone), each range once",
    ),
    Metric(
        "OldestRecordAgeSeconds",
        "",
        "containers: the age of the oldest record waiting in the stream (the consumer's; Lambda's is IteratorAge)",
    ),
    Metric("StreamChanged", "", "the stream check: 1 while the mapping reads another stream than the table's latest"),
    Metric("CanaryLatencySeconds", "", "the canary: seconds from its session's delete until the worker freed it"),
    Metric("CanaryNotCleaned", "", "the canary: sessions the worker did not free within CANARY_TIMEOUT_SECONDS"),
    Metric("CanarySessionsCleaned", "", "canary sessions cleaned (never counted in SessionsCleaned)"),
    Metric("SessionsSwept", "", "the sweeper: expired sessions it deleted"),
    Metric("SweepLagSeconds", "", "the sweeper: seconds between a swept session's ttl and its delete"),
    Metric("SessionsNotSwept", "Verdict", "the sweeper: expired sessions it did not delete, by why"),
    Metric("SweepQueryFailures", "", "the sweeper: expiry buckets whose query failed"),
    Metric(
        "SessionsElsewhere",
        "Region",
        "GLOBAL_TABLE: records of sessions another region owns, skipped here (that region's worker cleans them)",
    ),
    Metric("SessionsPlanned", "Reason", "a dry run: sessions it would have cleaned (never counted as cleaned)"),
    Metric("RecordsDeferred", "", "records sent to the backlog, with the actions they have left (a quota, or a pause)"),
    Metric(
        "MessagesRefused",
        "Reason (integrity, unreadable)",
        "backlog and dead-letter messages the worker cannot vouch for or read: nothing they name is freed, and they "
        "are kept",
    ),
    Metric("ModeChanges", "Mode", "the kill switch: each change of mode a process takes"),
    Metric("PausedBatches", "", "the kill switch: batches held while paused (or while the switch is unknown)"),
    Metric(
        "SwitchUnknown",
        "",
        "the kill switch: each reading that left it unknown (never read, or unreadable before a first reading), so "
        "that the process holds its records",
    ),
    Metric("ReconcileFreed", "Resource (grant, scratch, registry)", "reconcile: resources of gone sessions freed"),
    Metric("ReconcileKept", "Resource", "reconcile: resources kept (a live session, the grace period, a refusal)"),
    Metric("ReconcilePlanned", "Resource", "reconcile, dry run: resources it would free"),
    Metric("ReconcileFailed", "Resource", "reconcile: frees that failed (the next run tries again)"),
    Metric("ReconcileGone", "Resource", "reconcile: resources already gone when it came to free them"),
)
"""Every metric, in namespace METRICS_NAMESPACE with dimension ``Service``; the reference's table is made from it."""

ROLLED_UP = frozenset({"ActionFailures"})
"""Metrics also emitted with ``Service`` alone (one EMF document, two dimension sets): a sum over every value of their
own dimension, kinds installed later included, for an alarm that names no value."""


class Metrics:
    """Counts and values for one batch, flushed as EMF documents (one per dimension value)."""

    def __init__(self, settings: Settings, sink: MetricsSink) -> None:
        self.namespace = settings.metrics_namespace
        self.service = settings.service_name
        self.sink = sink
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str, str]] = Counter()
        self._values: dict[str, list[float]] = {}

    def count(self, name: str, dimension: str = "", value: str = "", amount: int = 1) -> None:
        with self._lock:
            self._counts[(name, dimension, value)] += amount

    def observe(self, name: str, value: float) -> None:
        with self._lock:
            self._values.setdefault(name, []).append(value)

    def record_outcomes(self, outcomes: Iterable[Outcome]) -> None:
        for outcome in outcomes:
            self._count_outcome(outcome)
            self._record_actions(outcome)
            if outcome.ttl_lag_seconds is not None:
                self.observe("TtlLagSeconds", outcome.ttl_lag_seconds)

    def _count_outcome(self, outcome: Outcome) -> None:
        if outcome.status is Status.CLEANED and outcome.tenant_id == CANARY_TENANT:
            self.count("CanarySessionsCleaned")  # the canary's: left out of the sessions counted
        elif outcome.status is Status.CLEANED and outcome.reason is not None:
            self.count("SessionsCleaned", "Reason", outcome.reason.value)
        elif outcome.status is Status.PLANNED and outcome.reason is not None:
            self.count("SessionsPlanned", "Reason", outcome.reason.value)  # a dry run: never counted as cleaned
        elif outcome.status is Status.SKIPPED:
            self.count("RecordsSkipped")
        elif outcome.dead_lettered:
            self.count("RecordsDeadLettered")
        elif outcome.status is Status.DEFERRED:
            self.count("RecordsDeferred")
        else:
            self.count("RecordsFailed")

    def _record_actions(self, outcome: Outcome) -> None:
        for action in outcome.actions:
            if not action.ok:
                self.count("ActionFailures", "Action", action.action)
            if action.detail.get("unbound"):  # SESSION_BINDING kept it (or, in a dry run, would)
                self.count("ResourcesUnbound", "Action", action.action)

    def flush(self) -> None:
        with self._lock:
            counts, values = self._counts, self._values
            self._counts, self._values = Counter(), {}
        self.sink.write(self._documents(counts, values))

    def _documents(self, counts: Counter[tuple[str, str, str]], values: dict[str, list[float]]) -> list[dict[str, Any]]:
        documents = []
        for (name, dimension, value), amount in sorted(counts.items()):
            documents.append(self._document(name, "Count", amount, {dimension: value} if dimension else {}))
        for name, observed in sorted(values.items()):
            for start in range(0, len(observed), 100):  # EMF takes at most 100 values per metric
                documents.append(self._document(name, "Seconds", observed[start : start + 100], {}))
        return documents

    def _document(self, name: str, unit: str, value: Any, dimensions: dict[str, str]) -> dict[str, Any]:
        dims = {"Service": self.service, **dimensions}
        sets = [sorted(dims), ["Service"]] if name in ROLLED_UP and dimensions else [sorted(dims)]
        return {
            "_aws": {
                "Timestamp": int(time.time() * 1000),
                "CloudWatchMetrics": [
                    {
                        "Namespace": self.namespace,
                        "Dimensions": sets,
                        "Metrics": [{"Name": name, "Unit": unit}],
                    }
                ],
            },
            **dims,
            name: value,
        }


def log_outcomes(outcomes: Iterable[Outcome]) -> None:
    """One log line per record outcome; failures at WARNING so they stand out."""
    for outcome in outcomes:
        level = logging.WARNING if outcome.failed else logging.INFO
        log.log(level, f"record {outcome.status.value}", extra=outcome.summary())
