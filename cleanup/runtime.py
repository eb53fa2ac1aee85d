"""What one process shares across batches: settings, clients, metrics, the thread pool, and bucket facts."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cleanup.calls import call
from cleanup.clients import Clients
from cleanup.retry import Deadline
from cleanup.telemetry import Metrics, MetricsSink, configure_logging
from schemas.settings import Settings, Versioning


class Runtime:
    """Built once per process by the entry point and passed down explicitly."""

    @classmethod
    def from_env(cls, **overrides: Any) -> Runtime:
        """The entry point's runtime: settings read from the environment (then ``overrides``), logging set up.

        Raises:
            pydantic.ValidationError: a setting in the environment is invalid.
        """
        settings = Settings.from_env()
        if overrides:
            settings = settings.model_copy(update=overrides)
        configure_logging(settings)
        return cls(settings)

    def __init__(self, settings: Settings, clients: Clients | None = None, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.clients = clients or Clients(settings)
        self.metrics = metrics or Metrics(settings, MetricsSink(settings.metrics_destination))
        self._lock = threading.Lock()
        self._bucket_lock = threading.Lock()
        self._versioned: dict[str, bool] = {}
        self._executor: ThreadPoolExecutor | None = None

    @property
    def executor(self) -> ThreadPoolExecutor:
        """The I/O pool records are cleaned on (kept warm across Lambda invocations)."""
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.settings.max_concurrency, thread_name_prefix="cleanup")
            return self._executor

    def is_versioned(self, bucket: str, deadline: Deadline | None = None) -> bool:
        """Whether ``bucket`` can hold versions; asked once per process unless SCRATCH_VERSIONING says."""
        mode = self.settings.scratch_versioning
        if mode is not Versioning.AUTO:
            return mode is Versioning.ENABLED
        known = self._versioned.get(bucket)
        if known is None:
            with self._bucket_lock:  # one GetBucketVersioning per bucket, however many threads ask at once
                known = self._versioned.get(bucket)
                if known is None:
                    answer = call(self.clients.s3.get_bucket_versioning, "GetBucketVersioning", deadline, Bucket=bucket)
                    known = self._versioned[bucket] = answer.get("Status") in ("Enabled", "Suspended")
        return known

    def close(self) -> None:
        with self._lock:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
