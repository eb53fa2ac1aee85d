"""The applications' side of the contract: a library for the application that writes the session items, so that the
worker, the sweeper and ``cleanup-worker reconcile`` find and free what each session holds. Create, touch and end a
session item so that expiry finds it on time.

Besides its resources (``connectionId``, ``scratchPrefix``, ``grantId``) and ``tenantId``, a session item carries the
two attributes expiry reads, always written together:

- ``ttl`` (N, epoch seconds): when the session expires. DynamoDB TTL deletes the item some time after it (best effort),
and the sweeper deletes it within a sweep of it. - ``expiryBucket`` (S): the ttl rounded down to
``EXPIRY_BUCKET_SECONDS``, as ``"<bucket-start>"``, or ``"<bucket-start>#<shard>"`` when ``EXPIRY_SHARDS`` > 1. It is
the partition key of the sweeper's sparse index (sort key ``ttl``), so the sweeper finds expired sessions with one Query
per bucket instead of a Scan.

``create_session`` refuses to overwrite a live item (its resources would never be cleaned), ``touch_session`` refreshes
ttl and bucket only while the item exists and its ttl is ahead (so it never resurrects a deleted or expired session),
``live_session`` reads an item as gone once its ttl has passed (TTL may delete it days later), and ``end_session``
deletes it: the stream's REMOVE then cleans everything up.

The session's KMS grant is created by ``create_session_grant``, named ``session:<session-id>`` (``grant_name``): the
name is how ``cleanup-worker reconcile`` finds the grant's session when the stream's record of it was lost. How ids,
keys (``session_key``), grant names, scratch prefixes, memberships and expiry buckets are spelled is
``schemas.convention``; every helper takes ``key_prefix`` and ``sort_key`` (None for a table without a sort key):
pass the deployment's, or reconcile looks for the item under another key. With SESSION_BINDING on (the default) the
worker frees nothing that is not bound to its session, so ``create_session`` refuses a prefix that does not end in
``<id>/`` (and the worker frees only ``<root>[<tenant>/]<id>/``). ``join_room`` writes a connection's room membership in
the connection registry with the session's id and its join time, by which reconcile finds the memberships of a session
that is gone.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cleanup.aws.answers import needed
from cleanup.aws.calls import call
from cleanup.exceptions import ConditionFailedError, SessionExistsError
from schemas.convention import DEFAULT_NAMES as DEFAULT_NAMES  # re-exported: the contract's names
from schemas.convention import KEY_PREFIX, SORT_KEY, grant_name, membership_item
from schemas.convention import bucket_start as bucket_start
from schemas.convention import expiry_bucket as expiry_bucket
from schemas.convention import expiry_buckets as expiry_buckets
from schemas.convention import session_key as session_key
from schemas.settings import AttributeNames, Settings

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_kms import KMSClient
    from mypy_boto3_kms.literals import GrantOperationType

__all__ = [
    "DEFAULT_BUCKET_SECONDS",
    "DEFAULT_NAMES",
    "MEMBERSHIP_TTL_SECONDS",
    "bucket_start",
    "create_session",
    "create_session_grant",
    "end_session",
    "expiry_bucket",
    "expiry_buckets",
    "join_room",
    "live_session",
    "session_key",
    "touch_session",
]

DEFAULT_BUCKET_SECONDS: int = Settings.model_fields["expiry_bucket_seconds"].default
MEMBERSHIP_TTL_SECONDS = 2 * 3600 + 600  # API Gateway's two-hour cap on a connection, and a margin


def create_session_grant(
    kms: KMSClient,
    key_id: str,
    session_id: str,
    *,
    grantee: str,
    operations: Sequence[GrantOperationType],
    retiring_principal: str,
) -> str:
    """Create ``session_id``'s grant on ``key_id`` (a key ARN), named by the convention (``grant_name``).

    ``retiring_principal`` is the worker's role, so that it may retire the grant; store the returned id as the
    item's ``grantId`` (and ``key_id`` as its ``kmsKeyId`` if it is not KMS_KEY_ID).

    Returns:
        The grant's id.

    Raises:
        ValueError: the session id does not follow the convention.
        TransientError / PermanentError: CreateGrant failed.
    """
    answer = call(
        kms.create_grant,
        "CreateGrant",
        None,
        KeyId=key_id,
        GranteePrincipal=grantee,
        Operations=list(operations),
        RetiringPrincipal=retiring_principal,
        Name=grant_name(session_id),
    )
    return str(needed(answer, "CreateGrant", "GrantId", kind=str))


def join_room(
    ddb: DynamoDBClient,
    table: str,
    room: str,
    connection_id: str,
    session_id: str,
    *,
    shard: int = 0,
    ttl_seconds: int = MEMBERSHIP_TTL_SECONDS,
    names: AttributeNames = DEFAULT_NAMES,
    now: float | None = None,
) -> dict[str, Any]:
    """Add ``connection_id`` (held by ``session_id``) to ``room`` in the registry, in the room's partition ``shard``.

    Returns:
        The membership's key (``pk``, ``sk``), as AttributeValues.

    Raises:
        ValueError: the session id does not follow the convention.
        TransientError / PermanentError: the write failed.
    """
    item = membership_item(
        room, connection_id, session_id, shard=shard, joined_at=_now(now), ttl_seconds=ttl_seconds, names=names
    )
    call(ddb.put_item, "PutItem", None, TableName=table, Item=item)
    return {name: item[name] for name in ("pk", "sk")}


def create_session(
    ddb: DynamoDBClient,
    table: str,
    session_id: str,
    *,
    tenant_id: str,
    scratch_prefix: str,
    ttl_seconds: int,
    connection_id: str | None = None,
    grant_id: str | None = None,
    kms_key_id: str | None = None,
    callback_url: str | None = None,
    names: AttributeNames = DEFAULT_NAMES,
    bucket_seconds: int = DEFAULT_BUCKET_SECONDS,
    shards: int = 1,
    key_prefix: str = KEY_PREFIX,
    sort_key: str | None = SORT_KEY,
    now: float | None = None,
) -> dict[str, Any]:
    """Put a new session item expiring ``ttl_seconds`` from now, with its expiry bucket.

    ``scratch_prefix`` is the session's own: ``<root><session_id>/`` (``<root><tenant>/<session_id>/`` when
    tenant-scoped), bound to the session by its last segment.

    Returns:
        The item written, as plain values (``ttl`` an int).

    Raises:
        ValueError: the scratch prefix does not end in ``<session_id>/`` (SESSION_BINDING would keep its data).
        SessionExistsError: an item already has this key; it is left as it was.
        TransientError / PermanentError: the write failed.
    """
    if scratch_prefix.rstrip("/").rpartition("/")[2] != session_id or not scratch_prefix.endswith("/"):
        raise ValueError(
            f"scratch prefix {scratch_prefix!r} does not end in the session's id {session_id!r} and '/': the worker "
            "would keep its data (SESSION_BINDING)"
        )
    ttl = _expiry(now, ttl_seconds)
    optional = {
        names.connection_id: connection_id,
        names.grant_id: grant_id,
        names.kms_key_id: kms_key_id,
        names.callback_url: callback_url,
    }
    item: dict[str, Any] = {
        **{name: value["S"] for name, value in session_key(session_id, names, key_prefix, sort_key).items()},
        names.tenant_id: tenant_id,
        names.scratch_prefix: scratch_prefix,
        names.ttl: ttl,
        names.expiry_bucket: expiry_bucket(ttl, bucket_seconds=bucket_seconds, shards=shards, session_id=session_id),
        **{name: value for name, value in optional.items() if value},
    }
    try:
        call(
            ddb.put_item,
            "PutItem",
            None,
            TableName=table,
            Item={name: {"N": str(value)} if name == names.ttl else {"S": value} for name, value in item.items()},
            ConditionExpression="attribute_not_exists(#pk)",
            ExpressionAttributeNames={"#pk": names.pk},
        )
    except ConditionFailedError as exc:
        raise SessionExistsError(f"session {session_id!r} already exists in {table}") from exc
    return item


def touch_session(
    ddb: DynamoDBClient,
    table: str,
    session_id: str,
    *,
    ttl_seconds: int,
    names: AttributeNames = DEFAULT_NAMES,
    bucket_seconds: int = DEFAULT_BUCKET_SECONDS,
    shards: int = 1,
    key_prefix: str = KEY_PREFIX,
    sort_key: str | None = SORT_KEY,
    now: float | None = None,
) -> bool:
    """Push a live session's expiry to ``ttl_seconds`` from now (ttl and bucket in one conditional update).

    A sweep that read the old ttl then fails its conditional delete, so the heartbeat wins.

    Returns:
        True if the session was refreshed; False if it no longer exists or its ttl has passed (expired, even if
        TTL has not deleted it yet, or ended: start a new one).

    Raises:
        TransientError / PermanentError: the update failed.
    """
    ttl = _expiry(now, ttl_seconds)
    bucket = expiry_bucket(ttl, bucket_seconds=bucket_seconds, shards=shards, session_id=session_id)
    try:
        call(
            ddb.update_item,
            "UpdateItem",
            None,
            TableName=table,
            Key=session_key(session_id, names, key_prefix, sort_key),
            UpdateExpression="SET #ttl = :ttl, #bucket = :bucket",
            # An expired item TTL has not deleted yet is not live: pushing its ttl would revive it.
            ConditionExpression="attribute_exists(#pk) AND #ttl > :now",
            ExpressionAttributeNames={"#ttl": names.ttl, "#bucket": names.expiry_bucket, "#pk": names.pk},
            ExpressionAttributeValues={
                ":ttl": {"N": str(ttl)},
                ":bucket": {"S": bucket},
                ":now": {"N": str(_now(now))},
            },
        )
    except ConditionFailedError:
        return False
    return True


def live_session(
    ddb: DynamoDBClient,
    table: str,
    session_id: str,
    *,
    names: AttributeNames = DEFAULT_NAMES,
    key_prefix: str = KEY_PREFIX,
    sort_key: str | None = SORT_KEY,
    now: float | None = None,
) -> dict[str, Any] | None:
    """The session's item if it is live: present and its ``ttl`` (a number) still ahead; a consistent read.

    TTL deletes an expired item some time after its ttl, possibly days later; until then the item is still there.
    An application deciding whether a session may be used asks this, not GetItem alone.

    Returns:
        The item, as AttributeValues; None when there is none or its ttl has passed.

    Raises:
        TransientError / PermanentError: the read failed.
    """
    key = session_key(session_id, names, key_prefix, sort_key)
    answer = call(ddb.get_item, "GetItem", None, TableName=table, Key=key, ConsistentRead=True)
    item = answer.get("Item")
    if item is None or not _before_ttl(item.get(names.ttl), _now(now)):
        return None
    return dict(item)


def _before_ttl(ttl: object, now: float) -> bool:
    # As touch_session's condition: a ttl that is missing or not a number is not "ahead" (create_session always
    # writes one, so such an item was not made by these helpers and is not vouched for).
    number = ttl.get("N") if isinstance(ttl, dict) else None
    try:
        return isinstance(number, str) and float(number) > now
    except ValueError:
        return False


def end_session(
    ddb: DynamoDBClient,
    table: str,
    session_id: str,
    *,
    names: AttributeNames = DEFAULT_NAMES,
    key_prefix: str = KEY_PREFIX,
    sort_key: str | None = SORT_KEY,
) -> bool:
    """Delete a session now (logout, admin purge); the stream's REMOVE cleans it up with reason ``explicit``.

    Returns:
        True if an item was deleted; False if there was none (already ended or expired).

    Raises:
        TransientError / PermanentError: the delete failed.
    """
    key = session_key(session_id, names, key_prefix, sort_key)
    response = call(ddb.delete_item, "DeleteItem", None, TableName=table, Key=key, ReturnValues="ALL_OLD")
    return bool(response.get("Attributes"))


def _now(now: float | None) -> int:
    return int(time.time() if now is None else now)


def _expiry(now: float | None, ttl_seconds: int) -> int:
    return _now(now) + ttl_seconds
