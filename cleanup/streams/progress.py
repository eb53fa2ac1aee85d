"""The poll loop's pulse: when it last came round, kept in memory for the lease's heartbeat and on disk for the
container's health check.

A loop that stops coming round (a call that never returns, a batch that never ends) is wedged: its health file goes
stale, so ``cleanup-worker health`` fails and the orchestrator replaces the container, and its heartbeat stops
renewing the lease, so a standby takes over. "Coming round" is counted generously (every pass of the loop, every
slice of a wait, every look at the lease while standing by), and the bound (HEALTH_STALE_SECONDS) is longer than one
batch attempt throttled up to its deadline, so a slow loop is not a wedged one.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from cleanup.telemetry import log

TOUCH_EVERY_SECONDS = 1.0
"""At most one write to the health file a second (or a quarter of the bound, if shorter): the loop may turn fast."""


class Progress:
    """When the loop last came round. ``beat()`` from the loop's thread; ``fresh`` from any thread."""

    def __init__(
        self, stale_after: float, health_file: Path | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.stale_after = stale_after
        self._file = health_file
        self._clock = clock
        self._lock = threading.Lock()
        self._beat_at = clock()
        self._touched_at: float | None = None
        self._touch_every = min(TOUCH_EVERY_SECONDS, stale_after / 4)
        self._warned = False

    @property
    def fresh(self) -> bool:
        """The loop came round within the bound."""
        with self._lock:
            return self._clock() - self._beat_at < self.stale_after

    def beat(self) -> None:
        """The loop came round: note it, and touch the health file if it was not touched just now."""
        now = self._clock()
        with self._lock:
            self._beat_at = now
            if self._file is None or (self._touched_at is not None and now - self._touched_at < self._touch_every):
                return
            self._touched_at = now
        try:
            self._file.touch()
        except OSError as exc:  # fails the health check, which names the file; the loop itself goes on
            if not self._warned:
                log.warning("cannot touch the health file", extra={"path": str(self._file), "error": str(exc)})
                self._warned = True

    def clear(self) -> None:
        """The loop has ended: remove the health file, so that the check fails from now on."""
        if self._file is not None:
            try:
                os.remove(self._file)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("cannot remove the health file", extra={"path": str(self._file), "error": str(exc)})
