"""The reconnect race: a session deleted and then recreated under the same key must keep its live resources.

Before acting, the worker reads the item that now has the deleted item's key (a consistent GetItem). Whatever the
live item still holds is left alone: the same connection (and its room memberships in the registry), the same grant,
and scratch data whose location overlaps the old prefix at all.

The live item's ``scratchPrefix`` is compared by where it points, never by how it is spelled, and without the guard's
rules: the guard decides what the worker may delete, while here the question is what the live session may still be
using, which the guard's verdict on its prefix does not answer. Every plausible reading of the live prefix is taken
(as written, percent-decoded, with backslashes as ``/``, with ``.`` and ``..`` segments resolved), and the old prefix
is kept if any of them overlaps it, in either direction. A live prefix that names no S3 location at all (another URL
scheme, an ``s3://`` URI without a bucket) cannot be compared: the old prefix is then kept too, and the step fails
permanently, naming both, so that a person decides. A live session's data is never deleted on a guess.
"""

from __future__ import annotations

import base64
import posixpath
from enum import Enum
from typing import Any
from urllib.parse import unquote

from cleanup.actions import connection, grant, registry, scratch
from cleanup.calls import call
from cleanup.exceptions import BadRecordError
from cleanup.guard import ScratchLocation
from cleanup.retry import Deadline
from schemas.attributes import AttributeDecodeError, decode_image
from schemas.session import Session, SessionItemError
from schemas.settings import AttributeNames


class Holding(Enum):
    """Whether the live item still holds a step's resource."""

    FREE = "free"  # no live item, or it holds something else: go ahead
    HELD = "held"  # the live session uses it: keep it
    UNKNOWN = "unknown"  # the live item's value cannot be compared: keep it, and report the step


def live_session(
    dynamodb: Any, table: str, keys: dict[str, Any], names: AttributeNames, deadline: Deadline | None = None
) -> Session | None:
    """The item now stored under ``keys``, or None if there is none.

    Raises:
        TransientError / PermanentError: the read failed.
        BadRecordError: the live item's session attributes cannot be read (nothing may then be freed).
    """
    wanted = (names.connection_id, names.grant_id, names.scratch_prefix, names.tenant_id)
    response = call(
        dynamodb.get_item,
        "GetItem",
        deadline,
        TableName=table,
        Key=client_keys(keys),
        ConsistentRead=True,
        ProjectionExpression=", ".join(f"#a{i}" for i in range(len(wanted))),
        ExpressionAttributeNames={f"#a{i}": name for i, name in enumerate(wanted)},
    )
    item = response.get("Item")
    if not item:
        return None
    try:
        return Session.from_image(decode_image(item, "LiveItem"), names)
    except (AttributeDecodeError, SessionItemError) as exc:
        raise BadRecordError(f"live item under the same key is unreadable: {exc}") from exc


def client_keys(keys: dict[str, Any]) -> dict[str, Any]:
    """Stream-record keys (binary as base64 text) in the form boto3's client sends (binary as bytes)."""
    converted = {}
    for name, value in keys.items():
        if isinstance(value, dict) and isinstance(value.get("B"), str):
            value = {"B": base64.b64decode(value["B"])}
        converted[name] = value
    return converted


def holding(action: str, resource: str, live: Session | None, *, old: ScratchLocation | None, bucket: str) -> Holding:
    """Whether ``live`` (the item now under the deleted one's key) still holds ``resource``.

    Args:
        action: the step's action (connection, registry, grant or scratch).
        resource: the connection id or grant id (scratch steps are compared by ``old``).
        live: the live item, or None when there is none.
        old: where the scratch step would delete, as the guard resolved it.
        bucket: SCRATCH_BUCKET, the bucket a bare key prefix of the live item lies in.
    """
    if live is None:
        return Holding.FREE
    if action == scratch.ACTION:
        if live.scratch_prefix is None or old is None:
            return Holding.FREE
        return scratch_holding(old, live.scratch_prefix, bucket)
    # The registry's memberships belong to the connection: a live session still on it keeps them too.
    held = {
        connection.ACTION: live.connection_id,
        registry.ACTION: live.connection_id,
        grant.ACTION: live.grant_id,
    }.get(action)
    return Holding.HELD if held is not None and held == resource else Holding.FREE


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
