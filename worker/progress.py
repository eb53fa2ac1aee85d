"""Progress of the long commands (replay, capture, redrive, sweep): what is done, the rate and, when the total is
known, an ETA, drawn by tqdm on stderr.

Shown only when stderr is a terminal and the command prints no JSON: a pipe, a log file or a ``--json`` consumer sees
nothing of it. The bar is cleared when the work ends, so what stays on the terminal is the command's own report.
"""

from __future__ import annotations

import sys
from typing import IO, Any

from tqdm import tqdm


def bar(what: str, *, total: float | None = None, unit: str = "records", quiet: bool = False, **options: Any) -> Any:
    """A progress bar for ``what`` (a tqdm, disabled off a terminal or when ``quiet``); use it as a context manager.

    Args:
        what: the bar's label, e.g. ``"replay"``.
        total: the amount of work, when known (the ETA needs it).
        unit: what ``update`` counts.
        quiet: never show it (``--json``).
        options: more of tqdm's options (``unit_scale``, ``stream`` for tests: the stream to draw on).
    """
    stream: IO[str] = options.pop("stream", None) or sys.stderr
    shown = not quiet and stream.isatty()
    return tqdm(
        desc=what, total=total, unit=unit, file=stream, disable=not shown, leave=False, dynamic_ncols=True, **options
    )
