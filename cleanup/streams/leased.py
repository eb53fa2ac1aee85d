"""A consumer of one stream under its lease (``cleanup.streams.lease``): standing by until it holds the lease,
consuming while a heartbeat renews it, and stopping at once when it is lost; waits in slices that keep both the lease
and the loop's pulse (``cleanup.streams.progress``) fresh. The stream poller is one (``cleanup.streams.poller``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from cleanup.exceptions import LeaseLostError, TransientError
from cleanup.runtime import Runtime
from cleanup.streams.lease import Heartbeat, Lease, owner_name
from cleanup.streams.progress import Progress
from cleanup.streams.retry_in_place import may_move_past
from cleanup.streams.shard_state import PollSummary
from cleanup.telemetry import log


class LeasedConsumer:
    """The lease-holding frame of a stream's consumer; ``_consume`` is the consuming itself."""

    def __init__(
        self,
        runtime: Runtime,
        stream_arn: str,
        *,
        consumer_id: str | None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        settings = runtime.settings
        self.runtime = runtime
        self.stream_arn = stream_arn
        self.consumer_id = owner_name(consumer_id)
        self.summary = PollSummary()
        self.lease = Lease(
            runtime.clients.dynamodb,
            settings.checkpoint_table,
            stream_arn,
            self.consumer_id,
            settings.lease_seconds,
            clock,
        )
        self.progress = Progress(settings.stale_after, Path(settings.health_file), clock)
        self._clock = clock
        self._stopping = threading.Event()
        self._sleep = sleep or self._stopping.wait
        self._dry_run = not may_move_past(settings)

    def request_stop(self) -> None:
        """Stop after the batch in flight, its checkpoint written (safe from a signal handler)."""
        self._stopping.set()

    def _consume(self, until_idle: bool) -> None:
        raise NotImplementedError

    def _lease_lost(self) -> None:
        """Forget what was read under the lease just lost."""

    def _consume_under_lease(self, until_idle: bool) -> None:
        while self._await_lease():
            try:
                with Heartbeat(self.lease, alive=lambda: self.progress.fresh):
                    self._consume(until_idle)
                return
            except LeaseLostError:
                log.error("lease lost: stopped consuming", extra={"consumer": self.consumer_id})
                self.summary.lease_lost = True
                self._lease_lost()
                if until_idle:
                    return

    def _await_lease(self) -> bool:
        standing_by = False
        while not self._stopping.is_set():
            self.progress.beat()
            try:
                if self.lease.try_acquire():
                    return True
            except TransientError as exc:
                log.warning("cannot read the lease; will retry", extra={"error": str(exc)})
            if not standing_by:
                extra = {"consumer": self.consumer_id, "streamArn": self.stream_arn}
                log.info("standing by: another consumer holds the stream's lease", extra=extra)
                standing_by = True
            self.summary.standby_polls += 1
            self._wait(self.lease.lease_seconds / 4)
        return False

    def _ensure_lease(self) -> None:
        if self._dry_run:
            return
        if not self.lease.renew_if_due():
            raise LeaseLostError(f"{self.consumer_id} no longer holds the lease of {self.stream_arn}")

    def _wait(self, seconds: float) -> None:
        end = self._clock() + max(0.0, seconds)
        # In slices: the lease is renewed, and the loop's pulse kept fresh, however the two bounds are set.
        slice_seconds = min(self.lease.lease_seconds / 4, self.progress.stale_after / 2)
        while not self._stopping.is_set() and (remaining := end - self._clock()) > 0:
            self.progress.beat()
            if self.lease.held:
                self._ensure_lease()
            self._sleep(min(remaining, slice_seconds))
