"""What reconcile looks at: the grants on the worker's keys and the session-level scratch prefixes, each mapped back
to its session by the write path's convention (``cleanup.application_contract``).

* **Grants.** ListGrants (paged, paced) on KMS_KEY_ID and every ALLOWED_KMS_KEY_IDS key. A grant named
  ``session:<session-id>`` is that session's; any other grant follows no convention and is only counted.
* **Scratch prefixes.** ListObjectsV2 with ``Delimiter="/"`` under SCRATCH_ROOT, to the depth of the documented
  layout: ``<root><session-id>/``, or ``<root><tenant>/<session-id>/`` when SCRATCH_TENANT_SCOPED is on. A prefix
  whose last segment is no convention's session id is only counted. Objects lying beside the session folders are
  not looked at.
* **Registry memberships** (with REGISTRY_TABLE). A consistent Scan (paged, paced) reading the key, the connection
  id, the session id and the join time. A membership is its session's when its ``sessionId`` follows the convention
  and it is its connection's (``registry.own_key``: the connection-id attribute is set and the key names it); any
  other is only counted.
* **The session's key.** ``pk = <SESSION_KEY_PREFIX or "session#"><session-id>`` and, when the session table has a
  sort key, ``sk = <SESSION_SORT_KEY>`` (which must then be set: ``meta`` for what ``create_session`` writes). A
  table keyed any other way (``check_shape``: other key attributes, SESSION_SORT_KEY without a sort key or missing
  with one, an ATTR_* naming a key attribute, as a table keyed by its connection id does) is refused before anything
  is listed.

Every listing must name its bucket, as on the stream path: an answer that does not cannot say what is there.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cleanup.actions import grant, registry, scratch
from cleanup.aws.calls import call
from cleanup.core.guard import ScratchLocation, resolve_prefix
from cleanup.deadline import Deadline
from cleanup.exceptions import MissingConfigError, PermanentError, TransientError
from schemas.convention import GRANT_NAME_PREFIX, KEY_PREFIX, SESSION_ID, SORT_KEY
from schemas.settings import AttributeNames, Settings

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_kms import KMSClient
    from mypy_boto3_kms.type_defs import ListGrantsRequestTypeDef
    from mypy_boto3_s3 import S3Client


SCAN_PAGE = 1000  # memberships read at a time


@dataclass(frozen=True)
class Found:
    """One listed resource: a grant (``ident`` its id, ``key_id`` its key), a scratch prefix (``where``), or a
    registry membership (``ident`` its connection id, ``membership`` its key).

    ``session_id`` is None when the resource follows no convention; ``created`` is the grant's CreationDate or the
    membership's join time (epoch seconds), None when not given."""

    resource: str
    ident: str
    session_id: str | None
    created: float | None = None
    key_id: str | None = None
    where: ScratchLocation | None = None
    membership: dict[str, Any] | None = field(default=None, hash=False)

    @property
    def location(self) -> Any:
        """What its kind frees it by besides ``ident``: the membership's key, the prefix, or the grant's key."""
        return next((where for where in (self.membership, self.where, self.key_id) if where is not None), None)


def allowed_keys(settings: Settings) -> list[str]:
    """KMS_KEY_ID and the ALLOWED_KMS_KEY_IDS keys, each once."""
    keys = [settings.kms_key_id or "", *settings.allowed_kms_key_ids]
    return list(dict.fromkeys(key for key in keys if key))


def grants(kms: KMSClient, keys: list[str], deadline: Deadline) -> Iterator[Found]:
    """Every grant on ``keys``, page by page.

    Raises:
        TransientError / PermanentError: a ListGrants call failed, or a truncated page gave no marker to go on.
    """
    for key in keys:
        marker: str | None = None
        while True:
            request: ListGrantsRequestTypeDef = {"KeyId": key}
            if marker:
                request["Marker"] = marker
            page = call(kms.list_grants, "ListGrants", deadline, **request)
            for listed in page.get("Grants", []):
                yield _grant(key, listed)
            if not page.get("Truncated"):
                break
            marker = page.get("NextMarker")
            if not marker:
                raise TransientError(f"ListGrants on {key}: a truncated page without NextMarker")


def _grant(key: str, listed: Mapping[str, Any]) -> Found:
    name = str(listed.get("Name") or "")
    session_id = name.removeprefix(GRANT_NAME_PREFIX) if name.startswith(GRANT_NAME_PREFIX) else None
    created = listed.get("CreationDate")
    return Found(
        resource=grant.ACTION,
        ident=str(listed.get("GrantId")),
        session_id=session_id if session_id is not None and SESSION_ID.fullmatch(session_id) else None,
        created=created.timestamp() if isinstance(created, datetime) else None,
        key_id=key,
    )


def prefixes(s3: S3Client, settings: Settings, deadline: Deadline) -> Iterator[Found]:
    """Every session-level prefix under SCRATCH_ROOT, by the layout's depth.

    Raises:
        MissingConfigError: SCRATCH_BUCKET is not set.
        TransientError / PermanentError: a listing failed, or did not name its bucket.
    """
    bucket, root = settings.scratch_bucket, settings.scratch_root
    if not bucket:
        raise MissingConfigError("SCRATCH_BUCKET is not set: there are no scratch prefixes to reconcile")
    if not settings.scratch_tenant_scoped:
        for prefix in _folders(s3, bucket, root, deadline):
            yield _prefix(prefix, None, settings)
        return
    for tenant_prefix in _folders(s3, bucket, root, deadline):
        tenant = tenant_prefix[len(root) : -1]
        for prefix in _folders(s3, bucket, tenant_prefix, deadline):
            yield _prefix(prefix, tenant, settings)


def _folders(s3: S3Client, bucket: str, prefix: str, deadline: Deadline) -> Iterator[str]:
    request: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "Delimiter": "/"}
    while True:
        page = call(s3.list_objects_v2, "ListObjectsV2", deadline, **request)
        if page.get("Name") != bucket:
            raise TransientError(f"a listing of {prefix!r} that does not name its bucket: cannot tell what is there")
        for common in page.get("CommonPrefixes", []):
            folder = str(common.get("Prefix", ""))
            if folder.startswith(prefix) and folder != prefix:  # S3 lists nothing else; a garbled answer might
                yield folder
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            return
        request["ContinuationToken"] = token


def _prefix(prefix: str, tenant: str | None, settings: Settings) -> Found:
    session_id = prefix[:-1].rpartition("/")[2]
    try:
        where = resolve_prefix(prefix, settings, tenant)
    except PermanentError:  # the guard refuses it (a tenant segment it cannot use): no convention's prefix
        return Found(scratch.ACTION, prefix, None)
    return Found(scratch.ACTION, prefix, session_id if SESSION_ID.fullmatch(session_id) else None, where=where)


def newest(s3: S3Client, where: ScratchLocation, deadline: Deadline) -> float | None:
    """The LastModified (epoch seconds) of the newest object under ``where``; None when there is none."""
    latest: float | None = None
    request: dict[str, Any] = {"Bucket": where.bucket, "Prefix": where.prefix}
    while True:
        page = call(s3.list_objects_v2, "ListObjectsV2", deadline, **request)
        if page.get("Name") != where.bucket:
            raise TransientError(f"a listing of {where.prefix!r} that does not name its bucket: cannot tell its age")
        for listed in page.get("Contents", []):
            modified = listed.get("LastModified")
            stamp = modified.timestamp() if isinstance(modified, datetime) else float("inf")  # unknown: young
            latest = stamp if latest is None else max(latest, stamp)
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            return latest
        request["ContinuationToken"] = token


def memberships(
    dynamodb: DynamoDBClient, where: registry.Registry, names: AttributeNames, deadline: Deadline
) -> Iterator[list[Found]]:
    """Every membership in the registry, a Scan page at a time.

    Raises:
        TransientError / PermanentError: a Scan call failed.
    """
    wanted = dict.fromkeys((*where.keys, where.attribute, names.registry_session_id, names.registry_joined_at))
    aliases = {f"#a{i}": name for i, name in enumerate(wanted)}
    request: dict[str, Any] = {
        "TableName": where.table,
        "ProjectionExpression": ", ".join(aliases),
        "ExpressionAttributeNames": aliases,
        "ConsistentRead": True,
        "Limit": SCAN_PAGE,
    }
    while True:
        page = call(dynamodb.scan, "Scan", deadline, **request)
        yield [_membership(item, where, names) for item in page.get("Items", [])]
        if not page.get("LastEvaluatedKey"):
            return
        request["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def _membership(item: Mapping[str, Any], where: registry.Registry, names: AttributeNames) -> Found:
    connection_id, session_id = _text(item.get(where.attribute)), _text(item.get(names.registry_session_id))
    key = registry.own_key(dict(item), where, connection_id) if connection_id else None
    conventional = key is not None and session_id is not None and SESSION_ID.fullmatch(session_id) is not None
    joined = item.get(names.registry_joined_at)
    return Found(
        resource=registry.ACTION,
        ident=connection_id or "",
        session_id=session_id if conventional else None,
        created=_number(joined.get("N") if isinstance(joined, dict) else None),
        membership=key,
    )


def _text(value: object) -> str | None:
    text = value.get("S") if isinstance(value, dict) else None
    return text if isinstance(text, str) and text else None


def _number(text: object) -> float | None:
    try:
        number = float(text) if isinstance(text, str) else None
    except ValueError:  # not a number: its age is unknown, so it is kept
        return None
    return number if number is not None and math.isfinite(number) else None  # NaN would compare as old


def check_shape(settings: Settings, key_names: tuple[str, ...]) -> None:
    """Refuse a session table whose key reconcile cannot spell from a session id: its key must be ATTR_PK (and
    ATTR_SK), holding ``<SESSION_KEY_PREFIX or "session#"><session-id>`` (and SESSION_SORT_KEY, set).

    Read with another shape, no item would ever be found under the key reconcile asks for, and every grant would be
    taken for a gone session's.

    Raises:
        MissingConfigError: the table is keyed otherwise, SESSION_SORT_KEY is set on a table without a sort key or
            unset on a table with one, or an ATTR_* setting says the key holds something else than the session id
            (one line, naming the setting).
    """
    names = settings.attributes
    if key_names not in ((names.pk,), (names.pk, names.sk)):
        raise MissingConfigError(
            f"the session table is keyed by {', '.join(key_names)}, not ATTR_PK {names.pk!r} (and ATTR_SK "
            f"{names.sk!r}): reconcile cannot find a session's item"
        )
    if settings.session_sort_key is not None and len(key_names) == 1:
        raise MissingConfigError(
            f"SESSION_SORT_KEY is {settings.session_sort_key!r} but the session table has no sort key: reconcile "
            "cannot tell which item is a session's"
        )
    if settings.session_sort_key is None and len(key_names) == 2:
        raise MissingConfigError(
            f"the session table has a sort key ({key_names[1]!r}) and SESSION_SORT_KEY is not set: set it to the sort "
            "key of a session's item (the write path writes 'meta'); reconcile does not guess where sessions are"
        )
    for name, value in names.model_dump().items():
        if name not in ("pk", "sk") and not name.startswith("registry_") and value in key_names:
            raise MissingConfigError(
                f"ATTR_{name.upper()} is {value!r}, a key of the session table: the key holds more than "
                f"<SESSION_KEY_PREFIX><session-id>, so reconcile cannot find a session's item; it does not run"
            )


def key_text(key: dict[str, Any]) -> str:
    """A key as text equal for equal keys."""
    return json.dumps(key, sort_keys=True)


def session_key(session_id: str, settings: Settings, key_names: tuple[str, ...]) -> dict[str, Any]:
    """The session item's key (client form) for ``session_id``, on a table keyed by ``key_names``.

    Raises:
        MissingConfigError: the key's shape is not one reconcile can spell (``check_shape``).
    """
    check_shape(settings, key_names)
    names = settings.attributes
    key = {names.pk: {"S": f"{settings.session_key_prefix or KEY_PREFIX}{session_id}"}}
    if len(key_names) == 2:
        key[names.sk] = {"S": settings.session_sort_key or SORT_KEY}  # set: check_shape refuses a sort key without
    return key
