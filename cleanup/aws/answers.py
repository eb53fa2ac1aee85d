"""Reading an AWS answer: every field the worker needs, read so that a missing or cut one is a retry, not a crash.

botocore parses a 200 whose body is empty or cut short as an answer without the fields it should carry (JSON
protocols read such a body as ``{}`` or ``{"message": <the text>}``). A field read by subscript would then raise
``KeyError``, past every ``except CleanupError``: a batch already cleaned would fail whole, its records delivered
again, a retry spent. ``needed(answer, "GenerateMac", "Mac")`` reads it instead, and raises ``TransientError`` naming
the call and the field: the records concerned are reported and tried again, as for any answer the worker cannot
positively understand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cleanup.exceptions import TransientError


def needed(answer: object, what: str, *path: str | int, kind: type | tuple[type, ...] | None = None) -> Any:
    """``answer[path[0]][path[1]]...``, or a transient error when a step of the path is not there.

    Args:
        answer: the parsed answer of the call (or a part of it).
        what: the call's name (``GenerateMac``), for the error.
        path: the keys (or list indexes) to follow.
        kind: the type(s) the value must have (None: any, None itself excluded).

    Raises:
        TransientError: a step is missing, or the value is None or not of ``kind``: the answer is not understood.
    """
    value: Any = answer
    for step in path:
        if isinstance(step, int):
            present = isinstance(value, list | tuple) and -len(value) <= step < len(value)
        else:
            present = isinstance(value, Mapping) and step in value
        if not present:
            raise missing(what, path)
        value = value[step]
    if value is None or (kind is not None and not isinstance(value, kind)):
        raise missing(what, path)
    return value


def missing(what: str, path: tuple[str | int, ...]) -> TransientError:
    """The error of an answer without ``path``: transient, since a cut answer tells nothing of the request's fate."""
    named = ".".join(str(step) for step in path) or "a body"
    return TransientError(f"{what}: the answer carries no usable {named} (empty or cut): cannot tell, try again")
