"""How a session's item key, grant name, scratch prefix and registry memberships are spelled, so that reconcile can
map a resource back to its session (the write path writes them so; an application creating its own follows the same
convention).

* session id: 1 to 128 letters, digits, ``_`` or ``-`` (``SESSION_ID``);
* item key: ``pk = session#<id>`` (or SESSION_KEY_PREFIX + id) and, in a table with a sort key, ``sk = meta`` (or
  SESSION_SORT_KEY);
* KMS grant Name: ``session:<id>`` (KMS grant names take letters, digits and ``:/_-`` only, so not the ``#`` key);
* scratch prefix: ``<root><id>/``, or ``<root><tenant>/<id>/`` when SCRATCH_TENANT_SCOPED is on;
* registry membership: ``pk = room#<room>#<shard>``, ``sk = conn#<connection-id>`` (the key names the connection),
  with ``connectionId``, ``sessionId`` (the session holding the connection), ``joinedAt`` and ``expiresAt`` (epoch
  seconds, the registry's TTL) (``membership_item``; the attribute names are ATTR_REGISTRY_*);
* expiry bucket (``expiryBucket``, the partition key of the sweeper's index): the ttl rounded down to
  EXPIRY_BUCKET_SECONDS, ``"<bucket-start>"``, or ``"<bucket-start>#<shard>"`` when EXPIRY_SHARDS > 1
  (``expiry_bucket``).
"""

from __future__ import annotations

import re
import zlib
from typing import Any

from schemas.settings import AttributeNames

KEY_PREFIX = "session#"
SORT_KEY = "meta"
GRANT_NAME_PREFIX = "session:"
SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
REGISTRY_EXPIRES_AT = "expiresAt"
CANARY_TENANT = "session-cleanup-canary"
"""The tenant of the canary's sessions (``cleanup.operations.canary``): the worker counts them apart."""
DEFAULT_NAMES = AttributeNames.model_construct()  # the documented defaults, without reading the environment


def checked(session_id: str, what: str) -> str:
    """``session_id``, if it follows the convention (``SESSION_ID``).

    Raises:
        ValueError: it does not; ``what`` names what could not be made for it.
    """
    if not SESSION_ID.fullmatch(session_id):
        raise ValueError(f"session id {session_id!r} is not 1-128 letters, digits, '_' or '-': no {what} for it")
    return session_id


def grant_name(session_id: str) -> str:
    """The Name of ``session_id``'s grant: ``session:<session-id>``.

    Raises:
        ValueError: the id does not follow the convention (``SESSION_ID``).
    """
    return f"{GRANT_NAME_PREFIX}{checked(session_id, 'grant name')}"


def membership_item(
    room: str,
    connection_id: str,
    session_id: str | None,
    *,
    shard: int,
    joined_at: int,
    ttl_seconds: int,
    names: AttributeNames,
) -> dict[str, Any]:
    """The registry item (AttributeValues) of ``connection_id``'s membership of ``room``, held by ``session_id``
    (None: a membership that names no session, which reconcile never frees).

    Raises:
        ValueError: the session id does not follow the convention.
    """
    item = {
        "pk": {"S": f"room#{room}#{shard}"},
        "sk": {"S": f"conn#{connection_id}"},
        names.registry_connection_id: {"S": connection_id},
        names.registry_joined_at: {"N": str(joined_at)},
        REGISTRY_EXPIRES_AT: {"N": str(joined_at + ttl_seconds)},
    }
    if session_id is not None:
        item[names.registry_session_id] = {"S": checked(session_id, "membership")}
    return item


def session_key(
    session_id: str,
    names: AttributeNames = DEFAULT_NAMES,
    key_prefix: str = KEY_PREFIX,
    sort_key: str | None = SORT_KEY,
) -> dict[str, Any]:
    """The item key of a session, as AttributeValues (``pk = session#<id>``, ``sk = meta``).

    ``sort_key``: the session row's sort key (SESSION_SORT_KEY where the deployment sets it); None for a table
    without a sort key.
    """
    key = {names.pk: {"S": f"{key_prefix}{session_id}"}}
    if sort_key is not None:
        key[names.sk] = {"S": sort_key}
    return key


def bucket_start(epoch: float, bucket_seconds: int) -> int:
    """The start of the expiry bucket that holds ``epoch``."""
    second = int(epoch)
    return second - second % bucket_seconds


def expiry_bucket(ttl: float, *, bucket_seconds: int, shards: int = 1, session_id: str = "") -> str:
    """The expiry bucket of a session: its ttl's bucket start, and a shard derived from its id when sharded.

    The shard is a hash of the session id, so a touch keeps a session on its shard.
    """
    start = bucket_start(ttl, bucket_seconds)
    if shards <= 1:
        return str(start)
    return f"{start}#{zlib.crc32(session_id.encode()) % shards}"


def expiry_buckets(since: float, until: float, *, bucket_seconds: int, shards: int = 1) -> list[str]:
    """Every expiry bucket (and shard) whose time span meets ``[since, until]``, oldest first."""
    starts = range(bucket_start(since, bucket_seconds), bucket_start(until, bucket_seconds) + 1, bucket_seconds)
    if shards <= 1:
        return [str(start) for start in starts]
    return [f"{start}#{shard}" for start in starts for shard in range(shards)]
