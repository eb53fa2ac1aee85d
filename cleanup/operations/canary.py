"""The end-to-end canary: a session made through the write path, ended, and timed until the worker has freed it.

Everything between a session's delete and its cleanup can break without a word: an event source mapping left on an
old stream, or disabled; a kill switch stuck in pause; a permission lost; a poller that stopped reading. None of them
emits an error, and a function that is never invoked emits no iterator age. The canary goes the way a user's session
goes:

1. it creates a canary session with the application's contract (``cleanup.application_contract``): one scratch object
   under the session's prefix, and, with CANARY_GRANT_PRINCIPAL (the worker's role), a grant on KMS_KEY_ID that
   allows DescribeKey only and that principal retires; then the item (no socket);
2. it deletes the item (``end_session``): the REMOVE goes through the stream to the worker, as a logout's does;
3. it looks, every POLL_SECONDS, until the object is gone and the grant retired, for at most CANARY_TIMEOUT_SECONDS.

It publishes ``CanaryLatencySeconds`` (from the delete until everything is freed) or, when the worker has not freed it
in time, ``CanaryNotCleaned`` (the template's ``CanaryAlarm``), with an ERROR naming what is left. A canary not freed
is left as it is: the worker frees it when it catches up; else reconcile (its grant follows the naming convention)
and the scratch root's lifecycle rule do.

Canary sessions are marked: tenant ``CANARY_TENANT`` and ids ``canary-<time>-<random>``. The worker counts their
cleanup as ``CanarySessionsCleaned``, never as ``SessionsCleaned`` (``cleanup.telemetry``), so the dashboard and the
counts leave them out. Under a dry run the worker frees nothing, so the canary does not run.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from cleanup.application_contract import create_session, create_session_grant, end_session
from cleanup.aws.calls import call
from cleanup.exceptions import CleanupError, MissingConfigError
from cleanup.killswitch import Mode
from cleanup.runtime import Runtime
from cleanup.telemetry import log
from schemas.convention import CANARY_TENANT, KEY_PREFIX, SORT_KEY

POLL_SECONDS = 2.0
ITEM_MARGIN_SECONDS = 3600
"""The canary item's ttl lies this far past the canary's bound: it is deleted long before, never expired."""
OBJECT_NAME = "canary"


@dataclass
class CanaryReport:
    """One canary: its session, whether the worker freed it in time, and how long it took (or waited)."""

    session_id: str
    cleaned: bool = False
    seconds: float = 0.0
    left: list[str] = field(default_factory=list)
    """What the worker had not freed when the canary gave up: ``scratch``, ``grant``."""
    skipped: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Canary:
    session_id: str
    bucket: str
    prefix: str
    key_id: str | None = None
    grant_id: str | None = None


def run_canary(
    runtime: Runtime,
    *,
    timeout: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> CanaryReport:
    """Create, end and watch one canary session; publish its latency, or that it was not cleaned.

    ``timeout``: the bound (default CANARY_TIMEOUT_SECONDS).

    Raises:
        MissingConfigError: no SESSION_TABLE or SCRATCH_BUCKET (nothing the canary could watch being freed).
        TransientError / PermanentError: the canary session could not be created or deleted.
    """
    settings = runtime.settings
    if not settings.session_table or not settings.scratch_bucket:
        raise MissingConfigError("the canary needs SESSION_TABLE and SCRATCH_BUCKET: a session and what it holds")
    if runtime.refresh_mode() is Mode.DRY_RUN:
        log.info("dry run: the worker frees nothing, so no canary runs")
        return CanaryReport("", skipped="dry-run")
    canary = _create(runtime)
    report = CanaryReport(canary.session_id)
    started = clock()
    _end(runtime, canary)
    bound = settings.canary_timeout_seconds if timeout is None else timeout
    while True:
        report.left = _left(runtime, canary)
        report.seconds = round(clock() - started, 3)
        if not report.left or report.seconds >= bound:
            break
        sleep(min(POLL_SECONDS, max(0.0, bound - report.seconds)))
    report.cleaned = not report.left
    _publish(runtime, report, bound)
    return report


def _create(runtime: Runtime) -> _Canary:
    settings = runtime.settings
    assert settings.session_table is not None and settings.scratch_bucket is not None
    session_id = f"canary-{int(time.time())}-{uuid.uuid4().hex[:8]}"
    tenant = f"{CANARY_TENANT}/" if settings.scratch_tenant_scoped else ""
    prefix = f"{settings.scratch_root}{tenant}{session_id}/"
    s3 = runtime.clients.s3
    body = b"a canary session's scratch object: the worker deletes it when the session ends"
    call(s3.put_object, "PutObject", None, Bucket=settings.scratch_bucket, Key=f"{prefix}{OBJECT_NAME}", Body=body)
    grant_id = None
    if settings.canary_grant_principal and settings.kms_key_id:
        principal = settings.canary_grant_principal
        grant_id = create_session_grant(
            runtime.clients.kms,
            settings.kms_key_id,
            session_id,
            grantee=principal,
            operations=["DescribeKey"],
            retiring_principal=principal,
        )
    create_session(
        runtime.clients.dynamodb,
        settings.session_table,
        session_id,
        tenant_id=CANARY_TENANT,
        scratch_prefix=prefix,
        ttl_seconds=int(settings.canary_timeout_seconds) + ITEM_MARGIN_SECONDS,
        grant_id=grant_id,
        kms_key_id=settings.kms_key_id if grant_id else None,
        names=settings.attributes,
        bucket_seconds=settings.expiry_bucket_seconds,
        shards=settings.expiry_shards,
        **_key_shape(runtime),
    )
    log.info("canary session created", extra={"sessionId": session_id, "grant": grant_id is not None})
    return _Canary(session_id, settings.scratch_bucket, prefix, settings.kms_key_id, grant_id)


def _key_shape(runtime: Runtime) -> dict[str, Any]:
    """The deployment's key: its prefix, and its sort key when the table has one."""
    settings = runtime.settings
    assert settings.session_table is not None
    keys = runtime.table_keys(settings.session_table)
    sort_key = (settings.session_sort_key or SORT_KEY) if len(keys) == 2 else None
    return {"key_prefix": settings.session_key_prefix or KEY_PREFIX, "sort_key": sort_key}


def _end(runtime: Runtime, canary: _Canary) -> None:
    settings = runtime.settings
    assert settings.session_table is not None
    end_session(
        runtime.clients.dynamodb,
        settings.session_table,
        canary.session_id,
        names=settings.attributes,
        **_key_shape(runtime),
    )


def _left(runtime: Runtime, canary: _Canary) -> list[str]:
    """What the worker has not freed yet (a resource that cannot be looked at counts as not freed)."""
    left = []
    try:
        listed = call(
            runtime.clients.s3.list_objects_v2,
            "ListObjectsV2",
            None,
            Bucket=canary.bucket,
            Prefix=canary.prefix,
            MaxKeys=1,
        )
        if listed.get("KeyCount", 0):
            left.append("scratch")
    except CleanupError as exc:
        log.warning("canary: its scratch object cannot be looked at", extra={"error": str(exc)})
        left.append("scratch")
    if canary.grant_id is None or canary.key_id is None:
        return left
    try:
        grants = call(runtime.clients.kms.list_grants, "ListGrants", None, KeyId=canary.key_id, GrantId=canary.grant_id)
        if grants.get("Grants"):
            left.append("grant")
    except CleanupError as exc:
        log.warning("canary: its grant cannot be looked at", extra={"error": str(exc)})
        left.append("grant")
    return left


def _publish(runtime: Runtime, report: CanaryReport, bound: float) -> None:
    extra = {"sessionId": report.session_id, "seconds": report.seconds}
    if report.cleaned:
        runtime.metrics.observe("CanaryLatencySeconds", report.seconds)
        log.info("canary cleaned", extra=extra)
    else:
        runtime.metrics.count("CanaryNotCleaned")
        log.error(
            f"canary not cleaned within {bound:g} s: check that the worker reads the table's latest stream, that its "
            "mapping is enabled, that the kill switch does not pause it, and its errors",
            extra={**extra, "left": report.left},
        )
    runtime.metrics.flush()
