"""The safety guard: decides, before any call, whether a scratch prefix may be deleted, an endpoint called, and a
grant retired on the key an item names at all.

The worker deletes every object under a prefix taken from a database item. A wrong or hostile value there could
otherwise empty the bucket, another tenant's area or another bucket, so the prefix must:

* be non-empty and end with ``/`` (``sessions/abc`` would also match ``sessions/abcdef/``);
* have no empty, ``.`` or ``..`` segment, also after percent-decoding, and no backslash or control character;
* lie strictly under ``SCRATCH_ROOT`` (the root itself is refused), and under ``<root><tenantId>/`` when
  ``SCRATCH_TENANT_SCOPED`` is on;
* be in ``SCRATCH_BUCKET``: an ``s3://`` URI naming any other bucket is refused.

With SESSION_BINDING, a session's grant and prefix must also be bound to it (``session_id`` says whose they must be;
``cleanup.actions.binding`` holds the rules: a prefix must be exactly the session's folder, ``<root>[<tenant>/]<id>/``).

A grant's key must be ``KMS_KEY_ID`` or one of ``ALLOWED_KMS_KEY_IDS``: RetireGrant is authorised by the grant (its
retiring principal), not by IAM, so nothing else stops an item from naming another key's grant that also lists this
worker as retiring principal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from urllib.parse import unquote

import botocore.loaders

from cleanup.exceptions import (
    MissingConfigError,
    RefusedConnectionError,
    RefusedEndpointError,
    RefusedKeyError,
    UnsafePrefixError,
)
from schemas.convention import KEY_PREFIX, SESSION_ID
from schemas.settings import KMS_KEY_ARN, Settings


@dataclass(frozen=True, slots=True)
class ScratchLocation:
    bucket: str
    prefix: str


def resolve_prefix(scratch_prefix: str, settings: Settings, tenant_id: str | None = None) -> ScratchLocation:
    """Turn an item's ``scratchPrefix`` into a bucket and prefix that are safe to delete.

    Raises:
        UnsafePrefixError: the prefix is refused; the message says which rule it broke.
        MissingConfigError: no ``SCRATCH_BUCKET`` is configured.
    """
    if not settings.scratch_bucket:
        raise MissingConfigError("SCRATCH_BUCKET is not set: the worker deletes scratch data in that bucket only")
    bucket, prefix = _split(scratch_prefix, settings.scratch_bucket)
    if bucket != settings.scratch_bucket:
        raise UnsafePrefixError(
            f"scratch prefix names bucket {bucket!r}, not SCRATCH_BUCKET {settings.scratch_bucket!r}"
        )
    _check_shape(prefix)
    root = settings.scratch_root
    if settings.scratch_tenant_scoped:
        if not tenant_id or "/" in tenant_id or tenant_id in (".", ".."):
            raise UnsafePrefixError("SCRATCH_TENANT_SCOPED is on and the session has no usable tenantId")
        root = f"{root}{tenant_id}/"
    if not prefix.startswith(root) or prefix == root:
        raise UnsafePrefixError(f"scratch prefix {prefix!r} is not strictly under {root!r}")
    return ScratchLocation(bucket, prefix)


# API Gateway's own management endpoint: the signed request stays with AWS, and IAM decides what it may do.
_EXECUTE_API = re.compile(
    r"https://(?P<api>[a-z0-9]{10})\.execute-api\.(?P<region>[a-z0-9-]+)\.(?P<suffix>[a-z0-9.-]+)/(?P<stage>[A-Za-z0-9_-]+)/?"
)


def callback_endpoint(item_url: str | None, settings: Settings) -> str:
    """The management endpoint to close a session's socket through.

    An item's ``callbackUrl`` is used only if it is WS_CALLBACK_URL or one of ALLOWED_CALLBACK_URLS: the worker signs
    its request with its own credentials, and must not send that to whatever host an item names, nor close a socket
    of another API or stage than its own. An execute-api endpoint is compared by API id, region, domain and stage
    (a trailing ``/`` aside, it is spelled one way); any other endpoint by its text, trailing ``/`` aside.

    Raises:
        RefusedEndpointError: the item's callbackUrl is none of those.
        MissingConfigError: neither the item nor WS_CALLBACK_URL names an endpoint.
    """
    if not item_url:
        if not settings.ws_callback_url:
            raise MissingConfigError("session has a connectionId but no callback endpoint: set WS_CALLBACK_URL")
        return settings.ws_callback_url
    allowed = list(settings.allowed_callback_urls)
    if settings.ws_callback_url:
        allowed.append(settings.ws_callback_url)
    if _endpoint(item_url) in {_endpoint(url) for url in allowed}:
        return item_url
    raise RefusedEndpointError(
        f"callbackUrl {item_url!r} is neither WS_CALLBACK_URL nor in ALLOWED_CALLBACK_URLS (an execute-api endpoint "
        "must name their API id, region and stage): the socket is kept"
    )


def _endpoint(url: str) -> tuple[str, ...]:
    """What identifies an endpoint: an execute-api endpoint's API id, region, domain and stage, else its text."""
    match = _EXECUTE_API.fullmatch(url)
    if match is None or execute_api_region(url) is None:
        return ("url", url.rstrip("/"))
    return ("execute-api", match["api"], match["region"], match["suffix"], match["stage"])


def grant_key(item_key: str | None, settings: Settings) -> str:
    """The key to retire a session's grant on: the item's ``kmsKeyId`` if it is KMS_KEY_ID or one of
    ALLOWED_KMS_KEY_IDS (compared exactly), else KMS_KEY_ID when the item names no key.

    The role's IAM policy cannot limit this: a grant's retiring principal may retire it whatever the policy allows.

    Raises:
        RefusedKeyError: the item names any other key, or a key id that is not an ARN (it cannot be compared).
        MissingConfigError: neither the item nor KMS_KEY_ID names a key.
    """
    if not item_key:
        if not settings.kms_key_id:
            raise MissingConfigError("session has a grantId but no key: set KMS_KEY_ID or the item's kmsKeyId")
        return settings.kms_key_id
    allowed = set(settings.allowed_kms_key_ids)
    if settings.kms_key_id:
        allowed.add(settings.kms_key_id)
    if item_key in allowed:
        return item_key
    shown = item_key if len(item_key) <= 300 else f"{item_key[:297]}..."
    if not KMS_KEY_ARN.fullmatch(item_key):
        raise RefusedKeyError(
            f"kmsKeyId {shown!r} is not a key ARN, so it cannot be matched with KMS_KEY_ID or ALLOWED_KMS_KEY_IDS: "
            "the grant is kept"
        )
    raise RefusedKeyError(
        f"kmsKeyId {shown!r} is neither KMS_KEY_ID nor in ALLOWED_KMS_KEY_IDS: the grant is kept; add the key to "
        "ALLOWED_KMS_KEY_IDS if its grants are the sessions', then redrive this record"
    )


def connection_id(value: str, settings: Settings) -> str:
    """The connection id in an item's connection attribute: the ``id`` group of CONNECTION_ID_PATTERN, or the whole
    value when no pattern is set.

    Raises:
        RefusedConnectionError: the value does not match the pattern (it is never sent to DeleteConnection: API
            Gateway would answer 410 for a wrong id, which reads as "already closed" and hides the mistake).
    """
    if settings.connection_id_pattern is None:
        return value
    match = _pattern(settings.connection_id_pattern).fullmatch(value)
    found = match.group("id") if match else None
    if not found:
        shown = value if len(value) <= 200 else f"{value[:197]}..."
        raise RefusedConnectionError(
            f"connection attribute {shown!r} does not match CONNECTION_ID_PATTERN "
            f"{settings.connection_id_pattern!r}: nothing was sent to DeleteConnection; fix the pattern (its group "
            "'id' is the connection id) or ATTR_CONNECTION_ID, then redrive this record"
        )
    return found


@cache
def _pattern(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def session_id(partition_key: str | None, settings: Settings) -> str | None:
    """The id of the session an item's partition key names: the key less SESSION_KEY_PREFIX (``session#`` when it is
    unset), if what is left follows the convention (``SESSION_ID``); None otherwise, when nothing can be bound to it."""
    prefix = settings.session_key_prefix or KEY_PREFIX
    if partition_key is None or not partition_key.startswith(prefix):
        return None
    ident = partition_key[len(prefix) :]
    return ident if SESSION_ID.fullmatch(ident) else None


def execute_api_region(url: str) -> str | None:
    """The region of an API Gateway execute-api endpoint, the region its requests must be signed for.

    None unless ``url`` is ``https://{api-id}.execute-api.{region}.{dns-suffix}/{stage}`` with a region that
    botocore's partition data lists and that partition's own DNS suffix.
    """
    match = _EXECUTE_API.fullmatch(url)
    if match is None:
        return None
    region = match["region"]
    return region if region in _known_regions().get(match["suffix"], frozenset()) else None


@cache
def _known_regions() -> dict[str, frozenset[str]]:
    """Regions by DNS suffix, from the partition data botocore ships (``aws-global`` and the like left out)."""
    regions: dict[str, set[str]] = {}
    for partition in botocore.loaders.create_loader().load_data("partitions")["partitions"]:
        pattern = re.compile(partition["regionRegex"])
        known = {name for name in partition["regions"] if pattern.fullmatch(name)}
        regions.setdefault(partition["outputs"]["dnsSuffix"], set()).update(known)
    return {suffix: frozenset(names) for suffix, names in regions.items()}


def _split(scratch_prefix: str, default_bucket: str) -> tuple[str, str]:
    if scratch_prefix.startswith("s3://"):
        bucket, _, prefix = scratch_prefix[len("s3://") :].partition("/")
        return bucket, prefix
    if "://" in scratch_prefix:
        raise UnsafePrefixError(f"scratch prefix {scratch_prefix!r} is neither a key prefix nor an s3:// URI")
    return default_bucket, scratch_prefix


def _check_shape(prefix: str) -> None:
    if not prefix:
        raise UnsafePrefixError("scratch prefix is empty")
    if not prefix.endswith("/"):
        raise UnsafePrefixError(f"scratch prefix {prefix!r} does not end with '/'")
    if any(ch == "\\" or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in prefix):
        raise UnsafePrefixError(f"scratch prefix {prefix!r} contains a backslash or a control character")
    for segment in prefix[:-1].split("/"):
        decoded = unquote(segment)
        if segment in ("", ".", "..") or decoded in ("", ".", "..") or "/" in decoded or "\\" in decoded:
            raise UnsafePrefixError(f"scratch prefix {prefix!r} has an empty, '.' or '..' segment")
