"""A server run in a child process (its own interpreter, so its threads do not share the measured worker's GIL).

The child prints its URL as its first line of output, then serves until it is terminated.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Self


class ChildServer:
    """``python -m <module> <arguments>`` for the length of a ``with`` block; ``url`` is the line it printed."""

    def __init__(self, module: str, *arguments: str) -> None:
        self.command = [sys.executable, "-m", module, *arguments]
        self.url = ""
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> Self:
        self._process = subprocess.Popen(self.command, stdout=subprocess.PIPE, text=True)
        assert self._process.stdout is not None
        self.url = self._process.stdout.readline().strip()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(10)
