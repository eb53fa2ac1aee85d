"""The exit codes of every ``cleanup-worker`` sub-command, in one place."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What a sub-command's exit status means; the same for all of them."""

    OK = 0
    """Everything it was asked to do is done."""
    FAILED = 1
    """It ran, and left something undone that it reports: records failed or blocked, messages kept, checks that could
    not reach AWS (and a consumer killed at the end of its shutdown grace period)."""
    USAGE = 2
    """Nothing was done: a bad command line, a bad setting, or something it must use is missing or refused (a
    table without a stream, a checkpoint table the role may not use, a file that cannot be read, a check that finds
    the account disagreeing with the settings)."""
    INTERRUPTED = 130
    """Stopped by Ctrl-C before it finished."""
