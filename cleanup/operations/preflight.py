"""Preflight: does the account hold what the worker's settings say it will find?

Each check reads one thing (DescribeTable, DescribeTimeToLive, HeadBucket, GetBucketLifecycleConfiguration,
DescribeKey) and says passed or failed, with the fix for a failure. Checks never change anything. A check that does
not apply says nothing: the scratch bucket and its backstop without the scratch action, the key without the grant
action, the endpoint without the connection action (ACTIONS); the dead-letter store with no dead-letter queue and
nothing wrong; the registry with none configured. ``cleanup.operations.binding_sample`` adds the binding's check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from cleanup.aws.answers import needed
from cleanup.aws.calls import call, call_or_gone
from cleanup.aws.clients import Clients
from cleanup.exceptions import CleanupError
from cleanup.operations.close_check import probe_close
from schemas.settings import DEAD_LETTER_OVERLAP_FIX, Settings, dead_letter_overlap

OLD_IMAGE_VIEWS = ("OLD_IMAGE", "NEW_AND_OLD_IMAGES")
TTL_ON = ("ENABLED", "ENABLING")


@dataclass(frozen=True)
class Target:
    """What the worker is configured to use (from the settings, overridden by the command line)."""

    table: str | None
    ttl_attribute: str
    bucket: str | None
    scratch_root: str
    kms_key_id: str | None
    callback_url: str | None
    dead_letter_queue_url: str | None = None
    dead_letter_bucket: str | None = None
    dead_letter_prefix: str = "dead-letter/"
    registry_table: str | None = None
    registry_index: str = "byConnection"
    registry_attribute: str = "connectionId"
    expiry_index: str | None = None
    expiry_bucket_attribute: str = "expiryBucket"
    backlog_queue_url: str | None = None
    integrity_key_id: str | None = None
    close: Settings | None = None
    """The http-close action's settings, when ACTIONS enables it."""
    actions: frozenset[str] = frozenset({"connection", "grant", "scratch", "registry"})
    """The enabled action kinds (ACTIONS): a check of what none of them needs says nothing."""
    settings: Settings | None = None
    """The whole settings, for the checks that read items as the worker reads them."""
    worker_principal: str | None = None
    """The principal the grants must name as retiring principal; None: the caller's own identity."""


@dataclass(frozen=True)
class CheckResult:
    """One line of the preflight: what was checked, whether it passed, what was found, and how to fix it."""

    name: str
    passed: bool
    detail: str
    fix: str = ""
    unchecked: bool = False
    """It failed because AWS could not be asked (credentials, network), not because the account disagrees."""


Check = Callable[[Clients, Target], CheckResult | None]


def run_checks(clients: Clients, target: Target) -> list[CheckResult]:
    """Every check that applies, in order; one that cannot reach AWS fails with the error and the rest go on."""
    results = []
    for check in CHECKS:
        try:
            result = check(clients, target)
        except CleanupError as exc:
            name = check.__name__.removeprefix("check_")
            result = CheckResult(
                name, False, f"could not check: {exc}", "check credentials and permissions", unchecked=True
            )
        if result is not None:
            results.append(result)
    return results


def check_table(clients: Clients, target: Target) -> CheckResult:
    """The session table exists."""
    name = "session table exists"
    if not target.table:
        return CheckResult(name, False, "no table configured", "set SESSION_TABLE or pass --table-name")
    table = _describe_table(clients, target.table)
    if table is None:
        return CheckResult(name, False, f"{target.table} not found", "create it, or point SESSION_TABLE at it")
    return CheckResult(name, True, f"{target.table} ({table.get('TableStatus', '?')})")


def check_ttl(clients: Clients, target: Target) -> CheckResult:
    """DynamoDB TTL is enabled on the attribute the worker reads as the ttl."""
    name = f"TTL enabled on {target.ttl_attribute!r}"
    if not target.table or _describe_table(clients, target.table) is None:
        return CheckResult(name, False, "no table to check", "fix the table first")
    described = call(clients.dynamodb.describe_time_to_live, "DescribeTimeToLive", None, TableName=target.table)
    ttl = needed(described, "DescribeTimeToLive", "TimeToLiveDescription", kind=dict)
    status, attribute = ttl.get("TimeToLiveStatus", "DISABLED"), ttl.get("AttributeName")
    fix = (
        f"aws dynamodb update-time-to-live --table-name {target.table} "
        f"--time-to-live-specification Enabled=true,AttributeName={target.ttl_attribute}"
    )
    if status not in TTL_ON:
        return CheckResult(name, False, f"TTL is {status}", fix)
    if attribute != target.ttl_attribute:
        return CheckResult(
            name, False, f"TTL is on {attribute!r}", f"set ATTR_TTL={attribute} (or --ttl-attribute), or {fix}"
        )
    return CheckResult(name, True, f"{status} on {attribute!r}")


def check_stream(clients: Clients, target: Target) -> CheckResult:
    """The table's stream is enabled with a view type that carries the old image (what a REMOVE cleans)."""
    name = "stream enabled with an old image"
    table = _describe_table(clients, target.table) if target.table else None
    if table is None:
        return CheckResult(name, False, "no table to check", "fix the table first")
    spec = table.get("StreamSpecification") or {}
    view = spec.get("StreamViewType") if spec.get("StreamEnabled") else None
    fix = (
        f"aws dynamodb update-table --table-name {target.table} "
        "--stream-specification StreamEnabled=true,StreamViewType=NEW_AND_OLD_IMAGES"
    )
    if view is None:
        return CheckResult(name, False, "no stream", fix)
    if view not in OLD_IMAGE_VIEWS:
        return CheckResult(
            name, False, f"view type {view}: a REMOVE carries nothing to clean", f"disable the stream, then {fix}"
        )
    return CheckResult(name, True, f"{view} ({table.get('LatestStreamArn', '')})")


def check_bucket(clients: Clients, target: Target) -> CheckResult | None:
    """The scratch bucket exists and is reachable (with the scratch action)."""
    if "scratch" not in target.actions:
        return None
    name = "scratch bucket exists"
    if not target.bucket:
        return CheckResult(name, False, "no bucket configured", "set SCRATCH_BUCKET or pass --bucket")
    if not _bucket_exists(clients, target.bucket):
        return CheckResult(
            name, False, f"{target.bucket} not found or not accessible", "create it, or fix SCRATCH_BUCKET"
        )
    return CheckResult(name, True, target.bucket)


def check_lifecycle(clients: Clients, target: Target) -> CheckResult | None:
    """Enabled lifecycle rules over the scratch root expire current and noncurrent versions (the backstop), with the
    scratch action."""
    if "scratch" not in target.actions:
        return None
    name = f"lifecycle backstop covers {target.scratch_root!r}"
    fix = (
        f"add enabled lifecycle rules with prefix {target.scratch_root!r}: Expiration Days, "
        "NoncurrentVersionExpiration, ExpiredObjectDeleteMarker (docs/lambda.md, 'Bring your own bucket')"
    )
    if not target.bucket or not _bucket_exists(clients, target.bucket):
        return CheckResult(name, False, "no bucket to check", "fix the bucket first")
    lifecycle = call_or_gone(
        clients.s3.get_bucket_lifecycle_configuration,
        "GetBucketLifecycleConfiguration",
        None,
        ("NoSuchLifecycleConfiguration",),
        Bucket=target.bucket,
    )
    if lifecycle is None:
        return CheckResult(name, False, "the bucket has no lifecycle configuration", fix)
    rules = lifecycle.get("Rules", [])
    covering = [rule for rule in rules if _covers(rule, target.scratch_root)]
    current = [r["ID"] for r in covering if r.get("Expiration", {}).get("Days") or r.get("Expiration", {}).get("Date")]
    noncurrent = [r["ID"] for r in covering if r.get("NoncurrentVersionExpiration", {}).get("NoncurrentDays")]
    missing = [what for what, ids in (("current", current), ("noncurrent", noncurrent)) if not ids]
    if missing:
        return CheckResult(name, False, f"no enabled rule over the root expires {' or '.join(missing)} versions", fix)
    return CheckResult(name, True, f"rules {', '.join(sorted(set(current + noncurrent)))}")


def check_key(clients: Clients, target: Target) -> CheckResult | None:
    """The grants' KMS key exists, is enabled, and is configured by ARN (RetireGrant needs the ARN), with the grant
    action."""
    if "grant" not in target.actions:
        return None
    name = "KMS key exists and is enabled"
    if not target.kms_key_id:
        return CheckResult(name, False, "no key configured", "set KMS_KEY_ID (the key ARN) or pass --kms-key-id")
    described = call_or_gone(
        clients.kms.describe_key, "DescribeKey", None, ("NotFoundException",), KeyId=target.kms_key_id
    )
    if described is None:
        return CheckResult(name, False, f"{target.kms_key_id} not found", "fix KMS_KEY_ID")
    key = needed(described, "DescribeKey", "KeyMetadata", kind=dict)
    if key.get("KeyState") != "Enabled":
        return CheckResult(
            name, False, f"key state {key.get('KeyState')}", f"aws kms enable-key --key-id {key['KeyId']}"
        )
    if target.kms_key_id != key["Arn"]:
        # RetireGrant does not take a key id or an alias.
        return CheckResult(name, False, "KMS_KEY_ID is not the key ARN", f"set KMS_KEY_ID={key['Arn']}")
    return CheckResult(name, True, key["Arn"])


def check_callback(clients: Clients, target: Target) -> CheckResult | None:
    """The WebSocket management endpoint is set (items without a callbackUrl use it), with the connection action."""
    if "connection" not in target.actions:
        return None
    name = "callback endpoint set"
    fix = "set WS_CALLBACK_URL=https://<api-id>.execute-api.<region>.amazonaws.com/<stage> (or --callback-url)"
    if not target.callback_url:
        return CheckResult(name, False, "no WS_CALLBACK_URL", fix)
    url = urlsplit(target.callback_url)
    if url.scheme not in ("https", "http") or not url.hostname:
        return CheckResult(name, False, f"{target.callback_url!r} is not an http(s) URL", fix)
    return CheckResult(name, True, target.callback_url)


def check_dead_letter_store(clients: Clients, target: Target) -> CheckResult | None:
    """Records too large for a dead-letter message go to a bucket that exists, outside the scratch root.

    Only said when a dead-letter queue is set or the prefix overlaps the root (the worker refuses to start then).
    """
    name = "dead-letter objects outside the scratch root"
    overlap = dead_letter_overlap(
        target.bucket, target.scratch_root, target.dead_letter_bucket, target.dead_letter_prefix
    )
    if overlap:
        return CheckResult(name, False, overlap, DEAD_LETTER_OVERLAP_FIX)
    if not target.dead_letter_queue_url:
        return None
    bucket = target.dead_letter_bucket or target.bucket
    if not bucket:
        return CheckResult(name, False, "no bucket for them", "set DEAD_LETTER_BUCKET (or SCRATCH_BUCKET)")
    if bucket != target.bucket and not _bucket_exists(clients, bucket):
        return CheckResult(name, False, f"{bucket} not found or not accessible", "create it, or fix DEAD_LETTER_BUCKET")
    return CheckResult(name, True, f"s3://{bucket}/{target.dead_letter_prefix}")


def check_binding(clients: Clients, target: Target) -> CheckResult | None:
    """Which SESSION_BINDING fits a sample of the table's sessions (``cleanup.operations.binding_sample``, which
    reads items as the worker does: imported when checked)."""
    from cleanup.operations.binding_sample import check_binding as sampled

    return sampled(clients, target)


def check_registry(clients: Clients, target: Target) -> CheckResult | None:
    """The connection registry's index exists, is keyed on the connection id, and is active: its items then carry the
    connection id and the table's keys (DynamoDB projects them into every index), which is what the worker reads back
    to delete a membership. Only said when a registry is configured."""
    if not target.registry_table or "registry" not in target.actions:
        return None
    name = f"registry index on {target.registry_attribute!r} projects the table's keys"
    table = _describe_table(clients, target.registry_table)
    if table is None:
        return CheckResult(name, False, f"{target.registry_table} not found", "create it, or fix REGISTRY_TABLE")
    keys = [str(needed(key, "DescribeTable", "AttributeName")) for key in needed(table, "DescribeTable", "KeySchema")]
    index = next((i for i in table.get("GlobalSecondaryIndexes", []) if i["IndexName"] == target.registry_index), None)
    create = (
        f"add a global secondary index {target.registry_index!r} with partition key {target.registry_attribute!r} "
        "(projection KEYS_ONLY is enough), or set REGISTRY_CONNECTION_INDEX"
    )
    if index is None:
        return CheckResult(name, False, f"{target.registry_table} has no index {target.registry_index!r}", create)
    partition = next(
        (str(k.get("AttributeName")) for k in index.get("KeySchema", []) if k.get("KeyType") == "HASH"), None
    )
    if partition != target.registry_attribute:
        fix = f"set ATTR_REGISTRY_CONNECTION_ID={partition} if that is the connection id, or {create}"
        return CheckResult(name, False, f"index {target.registry_index!r} is keyed on {partition!r}", fix)
    status = index.get("IndexStatus", "ACTIVE")
    if status != "ACTIVE":
        return CheckResult(name, False, f"index {target.registry_index!r} is {status}", "wait until it is ACTIVE")
    projection = index.get("Projection", {}).get("ProjectionType", "?")
    detail = f"{target.registry_table}/{target.registry_index}: keys {', '.join(keys)} ({projection})"
    return CheckResult(name, True, detail)


def check_expiry_index(clients: Clients, target: Target) -> CheckResult | None:
    """The sweeper's sparse index exists on the session table, keyed on the expiry bucket and the ttl. Only said when
    EXPIRY_INDEX is set (the sweeper runs only then)."""
    if not target.expiry_index or not target.table:
        return None
    name = "sweeper's expiry index"
    table = _describe_table(clients, target.table)
    if table is None:
        return CheckResult(name, False, f"{target.table} not found", "create it, or point SESSION_TABLE at it")
    wanted = {"HASH": target.expiry_bucket_attribute, "RANGE": target.ttl_attribute}
    create = (
        f"add a global secondary index {target.expiry_index!r} with partition key {wanted['HASH']!r} (S) and sort "
        f"key {wanted['RANGE']!r} (N), or set EXPIRY_INDEX to its name, or unset it (no sweeper)"
    )
    index = next((i for i in table.get("GlobalSecondaryIndexes", []) if i["IndexName"] == target.expiry_index), None)
    if index is None:
        return CheckResult(name, False, f"{target.table} has no index {target.expiry_index!r}", create)
    keys = {str(k.get("KeyType")): str(k.get("AttributeName")) for k in index.get("KeySchema", [])}
    if keys != wanted:
        return CheckResult(name, False, f"index {target.expiry_index!r} is keyed on {keys}", create)
    return CheckResult(name, True, f"{target.table}/{target.expiry_index}: {wanted['HASH']}, {wanted['RANGE']}")


def check_backlog_integrity(clients: Clients, target: Target) -> CheckResult | None:
    """With a backlog, its messages are tagged: the drain frees nothing from a message it cannot verify. Only said
    when a backlog is configured."""
    if not target.backlog_queue_url:
        return None
    name = "backlog messages tagged for the drain"
    if not target.integrity_key_id:
        fix = "set INTEGRITY_KEY_ID to the HMAC key (the template's IntegrityKey); until then nothing is deferred"
        return CheckResult(name, False, "BACKLOG_QUEUE_URL without INTEGRITY_KEY_ID", fix)
    return CheckResult(name, True, target.integrity_key_id)


def check_http_close(clients: Clients, target: Target) -> CheckResult | None:
    """With http-close enabled, the gateway answers a close for a connection nobody has with exactly
    CLOSE_GONE_STATUSES (``cleanup.operations.close_check``). Only said when http-close is enabled."""
    return None if target.close is None else CheckResult(*probe_close(target.close))


CHECKS: tuple[Check, ...] = (
    check_table,
    check_ttl,
    check_stream,
    check_bucket,
    check_lifecycle,
    check_key,
    check_callback,
    check_dead_letter_store,
    check_registry,
    check_expiry_index,
    check_backlog_integrity,
    check_http_close,
    check_binding,
)


def _describe_table(clients: Clients, table: str) -> dict[str, Any] | None:
    gone = ("ResourceNotFoundException",)
    described = call_or_gone(clients.dynamodb.describe_table, "DescribeTable", None, gone, TableName=table)
    return None if described is None else dict(needed(described, "DescribeTable", "Table", kind=dict))


def _bucket_exists(clients: Clients, bucket: str) -> bool:
    gone = ("404", "NoSuchBucket", "403", "AccessDenied", "Forbidden")
    return call_or_gone(clients.s3.head_bucket, "HeadBucket", None, gone, Bucket=bucket) is not None


def _covers(rule: Mapping[str, Any], root: str) -> bool:
    """An enabled rule whose only filter is a prefix that every key under ``root`` has."""
    if rule.get("Status") != "Enabled":
        return False
    filters: Iterable[str] = (rule.get("Filter") or {}).keys()
    if set(filters) - {"Prefix"}:
        return False  # tags or sizes: not every object under the root
    prefix = (rule.get("Filter") or {}).get("Prefix", rule.get("Prefix", ""))
    return root.startswith(prefix)
