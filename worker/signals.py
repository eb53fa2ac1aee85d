"""Graceful shutdown on SIGTERM/SIGINT, bounded by SHUTDOWN_GRACE_SECONDS.

The first signal asks the consumer to stop after its in-flight batch and checkpoint; if it has not exited when the
grace period ends (a call hanging on a dead network), the process exits at once. Nothing is lost then either: the
records after the last checkpoint are read again by the next consumer.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from cleanup.telemetry import log
from worker.exit_codes import ExitCode


@contextmanager
def shutdown_on_signals(stop: Callable[[], None], grace_seconds: float) -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT call ``stop`` once and start a watchdog of ``grace_seconds``."""
    watchdog = threading.Timer(grace_seconds, _force_exit, args=(grace_seconds,))
    watchdog.daemon = True

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if watchdog.is_alive():
            return
        log.info("stopping: finishing the batch in flight", extra={"signal": signal.Signals(signum).name})
        stop()
        watchdog.start()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        watchdog.cancel()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _force_exit(grace_seconds: float) -> None:
    log.error("shutdown grace period over; exiting without waiting", extra={"graceSeconds": grace_seconds})
    os._exit(ExitCode.FAILED)
