"""What a live item holds: whether the session now stored under a deleted one's key still uses its scratch data.

The live item's ``scratchPrefix`` is compared by where it points, never by how it is spelled, and without the guard's
rules: the guard decides what the worker may delete, while here the question is what the live session may still be
using, which the guard's verdict on its prefix does not answer. Every plausible reading of the live prefix is taken
(as written, percent-decoded, with backslashes as ``/``, with ``.`` and ``..`` segments resolved), and the old prefix
is kept if any of them overlaps it, in either direction. A live prefix that names no S3 location at all (another URL
scheme, an ``s3://`` URI without a bucket) cannot be compared: the old prefix is then kept too, and the step fails
permanently, naming both, so that a person decides. A live session's data is never deleted on a guess.
"""

from __future__ import annotations

import posixpath
from urllib.parse import unquote

from cleanup.core.action_api import Holding
from cleanup.core.guard import ScratchLocation


def scratch_holding(old: ScratchLocation, live_prefix: str, bucket: str) -> Holding:
    """Whether a live ``scratchPrefix`` may overlap ``old``, under any reading of it."""
    readings = live_readings(live_prefix, bucket)
    if readings is None:
        return Holding.UNKNOWN
    return Holding.HELD if any(overlaps(old, reading) for reading in readings) else Holding.FREE


def live_readings(prefix: str, bucket: str) -> set[ScratchLocation] | None:
    """Every location a live item's ``scratchPrefix`` may mean, or None when it names no S3 location at all."""
    if prefix.startswith("s3://"):
        bucket, _, key = prefix[len("s3://") :].partition("/")
        if not bucket:
            return None
    elif "://" in prefix or prefix.startswith("arn:"):
        return None
    else:
        key = prefix
    keys = {key, unquote(key), key.replace("\\", "/")}
    keys |= {_resolved(text) for text in keys}
    keys |= {text.lstrip("/") for text in keys}
    return {ScratchLocation(bucket.lower(), text) for text in keys}


def overlaps(a: ScratchLocation, b: ScratchLocation) -> bool:
    """Whether some key lies under both prefixes: same bucket, and one prefix starts with the other."""
    if a.bucket.lower() != b.bucket.lower():
        return False
    return a.prefix.startswith(b.prefix) or b.prefix.startswith(a.prefix)


def _resolved(key: str) -> str:
    """``key`` with ``.``, ``..`` and empty segments resolved, as a path-minded writer may have meant it."""
    if not key:
        return key
    resolved = posixpath.normpath(key)
    if resolved == ".":
        return ""
    return resolved + "/" if key.endswith("/") and not resolved.endswith("/") else resolved
