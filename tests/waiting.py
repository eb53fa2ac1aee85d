"""The tests' one way to wait for something another process or thread does: poll until it holds.

The limit is a hang guard, not a timing assertion: a condition that never holds fails the test with what it was
waiting for (and the child's log, when there is one) instead of hanging the run.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

WAIT_GUARD_SECONDS = 60.0


def wait_for(
    condition: Callable[[], object],
    what: str,
    *,
    limit: float = WAIT_GUARD_SECONDS,
    interval: float = 0.05,
    alive: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
) -> None:
    """Poll ``condition`` until it is true; fail naming ``what`` after ``limit`` seconds, or when ``alive`` exits."""
    give_up = time.monotonic() + limit
    while not condition():
        tail = f"; log:\n{log.read_text()[-5000:]}" if log is not None and log.exists() else ""
        assert alive is None or alive.poll() is None, f"the process exited while waiting for {what}{tail}"
        assert time.monotonic() < give_up, f"gave up waiting for {what}{tail}"
        time.sleep(interval)
