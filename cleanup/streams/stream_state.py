"""Why the stream poller cannot consume, for its health check: a file beside HEALTH_FILE (``<HEALTH_FILE>.stream``).

The file exists only while the poller's stream has ended (disabled, every shard read; or gone) and its table names no
other stream to follow: the loop is then alive but cleans nothing, which the health check reports as unhealthy with
the file's one line. It is removed as soon as a stream is consumed again, and when the poller stops.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

SUFFIX = ".stream"


class StreamState:
    """The poller's side: say why it cannot consume, or that it can again."""

    def __init__(self, health_file: str) -> None:
        self.path = Path(f"{health_file}{SUFFIX}")

    def problem(self, reason: str) -> None:
        """Note why the poller cannot consume (best effort: a file that cannot be written is only not reported)."""
        with contextlib.suppress(OSError):
            self.path.write_text(reason + "\n")

    def clear(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)


def stream_problem(health_file: str) -> str | None:
    """The health check's side: why the poller's stream cannot be consumed, or None."""
    try:
        return Path(f"{health_file}{SUFFIX}").read_text().strip() or None
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot read the poller's stream state: {exc}"
