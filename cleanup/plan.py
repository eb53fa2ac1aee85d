"""Planning a session's cleanup into steps, and carrying them out (or, in a dry run, describing them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cleanup.actions import connection, grant, registry, scratch
from cleanup.aws.retry import Deadline, call_with_retry
from cleanup.exceptions import CleanupError, NowHeldError, PermanentError
from cleanup.guard import ScratchLocation, callback_endpoint, execute_api_region, grant_key, resolve_prefix
from cleanup.race import Holding, holding
from cleanup.runtime import Runtime
from schemas.outcomes import ActionResult, ActionStatus
from schemas.session import Session

if TYPE_CHECKING:
    from cleanup.aws.batch_calls import BatchCalls

Run = Callable[[Deadline], tuple[ActionStatus, dict[str, Any]]]


@dataclass(frozen=True)
class Step:
    """One action on one resource. ``refusal`` is set when it must not (or cannot) be carried out."""

    action: str
    resource: str
    detail: dict[str, Any] = field(default_factory=dict)
    run: Run | None = None
    preview: Run | None = None
    refusal: PermanentError | None = None
    location: ScratchLocation | None = None  # where a scratch step deletes, as the guard resolved it


LiveReading = Callable[[Deadline], Session | None]
"""Reads the item now stored under the deleted session's key (a consistent read): the reconnect race, again."""


def plan(
    session: Session, runtime: Runtime, calls: BatchCalls | None = None, reread: LiveReading | None = None
) -> list[Step]:
    """The steps that free ``session``'s resources: close its socket, retire its grant, delete its scratch data, and
    (with a registry) remove its connection's room memberships.

    With ``calls``, scratch pages are deleted together with those of the batch's other records. With ``reread``, the
    live item is read again right before each scratch page is deleted.
    """
    steps = []
    if session.connection_id:
        steps.append(_connection_step(session, session.connection_id, runtime))
    if session.grant_id:
        steps.append(_grant_step(session, session.grant_id, runtime))
    if session.scratch_prefix is not None:  # an empty prefix is refused by the guard, not ignored
        steps.append(_scratch_step(session, session.scratch_prefix, runtime, calls, reread))
    if session.connection_id and runtime.settings.registry_table:
        steps.append(_registry_step(session.connection_id, runtime.settings.registry_table, runtime))
    return steps


def _connection_step(session: Session, connection_id: str, runtime: Runtime) -> Step:
    detail = {"connectionId": connection_id}
    try:
        endpoint = callback_endpoint(session.callback_url, runtime.settings)
    except PermanentError as exc:
        return Step(connection.ACTION, connection_id, detail, refusal=exc)

    region = execute_api_region(endpoint)  # an execute-api endpoint is signed for its own region

    def run(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
        return connection.close_connection(runtime.clients.management(endpoint, region), connection_id, deadline), {}

    return Step(connection.ACTION, connection_id, {**detail, "endpoint": endpoint}, run=run)


def _grant_step(session: Session, grant_id: str, runtime: Runtime) -> Step:
    detail = {"grantId": grant_id}
    try:
        key_id = grant_key(session.kms_key_id, runtime.settings)
    except PermanentError as exc:
        return Step(grant.ACTION, grant_id, detail, refusal=exc)

    def run(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
        return grant.retire_grant(runtime.clients.kms, key_id, grant_id, deadline), {}

    return Step(grant.ACTION, grant_id, {**detail, "keyId": key_id}, run=run)


def _scratch_step(
    session: Session, scratch_prefix: str, runtime: Runtime, calls: BatchCalls | None, reread: LiveReading | None
) -> Step:
    try:
        where = resolve_prefix(scratch_prefix, runtime.settings, session.tenant_id)
    except PermanentError as exc:
        return Step(scratch.ACTION, scratch_prefix, {"prefix": scratch_prefix}, refusal=exc)
    check = _still_free(reread, scratch_prefix, where, runtime.settings.scratch_bucket or "") if reread else None

    def run(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
        versioned = runtime.is_versioned(where.bucket, deadline)
        together = calls.deleter(where.bucket) if calls is not None else None
        try:
            deleted = scratch.delete_prefix(
                runtime.clients.s3,
                where,
                versioned=versioned,
                deadline=deadline,
                together=together,
                before_delete=check,
            )
        except NowHeldError as held:
            return ActionStatus.KEPT, {"heldBy": "live session", _unit(versioned): held.deleted}
        return (ActionStatus.DONE if deleted else ActionStatus.ALREADY_DONE), {_unit(versioned): deleted}

    def preview(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
        versioned = runtime.is_versioned(where.bucket, deadline)
        found = scratch.count_prefix(runtime.clients.s3, where, versioned=versioned, deadline=deadline)
        return ActionStatus.PLANNED, {_unit(versioned): found}

    detail = {"bucket": where.bucket, "prefix": where.prefix}
    return Step(scratch.ACTION, scratch_prefix, detail, run=run, preview=preview, location=where)


def _still_free(reread: LiveReading, prefix: str, where: ScratchLocation, bucket: str) -> Callable[[Deadline], None]:
    """Before a page is deleted: raises NowHeldError once a re-created session holds the prefix (or a failure when its
    prefix cannot be compared), as ``execute`` judges the first read."""

    def check(deadline: Deadline) -> None:
        live = reread(deadline)
        held = holding(scratch.ACTION, prefix, live, old=where, bucket=bucket)
        if held is Holding.HELD:
            raise NowHeldError(f"a session re-created under the same key now holds {where.prefix!r}: the rest is kept")
        if held is Holding.UNKNOWN and live is not None:
            raise _incomparable_prefix(prefix, live.scratch_prefix)

    return check


def _registry_step(connection_id: str, table: str, runtime: Runtime) -> Step:
    index, attribute = runtime.settings.registry_connection_index, runtime.settings.attributes.registry_connection_id

    def where(deadline: Deadline) -> registry.Registry:
        return registry.Registry(table, index, attribute, runtime.table_keys(table, deadline))

    def run(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
        wait = runtime.settings.retry_max_wait_seconds
        pruned = registry.prune(runtime.clients.dynamodb, where(deadline), connection_id, deadline, max_wait=wait)
        return (ActionStatus.DONE if pruned.deleted else ActionStatus.ALREADY_DONE), _memberships(pruned)

    def preview(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
        found = registry.count(runtime.clients.dynamodb, where(deadline), connection_id, deadline)
        return ActionStatus.PLANNED, _memberships(found)

    detail = {"connectionId": connection_id, "table": table, "index": index}
    return Step(registry.ACTION, connection_id, detail, run=run, preview=preview)


def _memberships(pruned: registry.Pruned) -> dict[str, Any]:
    return {"memberships": pruned.deleted, **({"kept": pruned.kept} if pruned.kept else {})}


def _unit(versioned: bool) -> str:
    return "versions" if versioned else "objects"


def execute(
    step: Step, runtime: Runtime, deadline: Deadline, *, live: Session | None = None, dry_run: bool = False
) -> ActionResult:
    """Carry out ``step`` with retries; never raises for the worker's own errors, it returns a failed result.

    What the live item under the same key still holds (``live``, the reconnect race) is kept.
    """
    held = holding(step.action, step.resource, live, old=step.location, bucket=runtime.settings.scratch_bucket or "")
    if held is Holding.HELD:
        return ActionResult(action=step.action, status=ActionStatus.KEPT, detail={"heldBy": "live session"})
    if held is Holding.UNKNOWN and live is not None:
        return _failed(step, _incomparable_prefix(step.resource, live.scratch_prefix))
    if step.refusal is not None:
        return _failed(step, step.refusal, refused=True)
    run = step.preview if dry_run else step.run
    if run is None:
        return ActionResult(action=step.action, status=ActionStatus.PLANNED, detail=step.detail)
    try:
        status, counts = call_with_retry(
            lambda: run(deadline), runtime.settings, deadline, on_retry=_retried(runtime, step)
        )
    except CleanupError as exc:
        return _failed(step, exc)
    return ActionResult(action=step.action, status=status, detail={**step.detail, **counts})


def _incomparable_prefix(old_prefix: str, live_prefix: str | None) -> PermanentError:
    return PermanentError(
        f"the live session under the same key has scratch prefix {live_prefix!r}, which names no S3 location that "
        f"can be compared with {old_prefix!r}: both are kept; check the live item, then redrive this record"
    )


def _retried(runtime: Runtime, step: Step) -> Callable[[BaseException], None]:
    def on_retry(exc: BaseException) -> None:
        runtime.metrics.count("Retries", "Action", step.action)

    return on_retry


def _failed(step: Step, exc: CleanupError, refused: bool = False) -> ActionResult:
    detail = {**step.detail, "refused": True} if refused else step.detail
    return ActionResult(
        action=step.action,
        status=ActionStatus.FAILED,
        detail=detail,
        error=str(exc),
        permanent=isinstance(exc, PermanentError),
    )
