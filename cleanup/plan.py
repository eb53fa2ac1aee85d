"""Planning a session's cleanup into steps, and carrying them out (or, in a dry run, describing them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cleanup.actions import connection, grant, registry, scratch
from cleanup.aws.coalesce import DELETE
from cleanup.aws.retry import Deadline, call_with_retry
from cleanup.exceptions import CleanupError, NowHeldError, PermanentError, UnboundResourceError
from cleanup.fence import Fence, incomparable_prefix
from cleanup.guard import (
    ScratchLocation,
    callback_endpoint,
    check_bound,
    execute_api_region,
    grant_key,
    resolve_prefix,
    session_id,
)
from cleanup.guard import connection_id as connection_id_of
from cleanup.race import Holding
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
    prepare: Callable[[Deadline], None] | None = None  # read-only calls sent when the record's cleanup starts


def plan(session: Session, runtime: Runtime, fence: Fence, calls: BatchCalls | None = None) -> list[Step]:
    """The steps that free ``session``'s resources: close its socket, retire its grant, delete its scratch data, and
    (with a registry) remove its connection's room memberships.

    Every destructive call of every step goes through ``fence`` (``cleanup.fence``). With ``calls``, scratch pages are
    deleted together with those of the batch's other records.
    """
    steps = []
    if session.connection_id:
        steps.append(_connection_step(session, session.connection_id, runtime, fence))
    if session.grant_id:
        steps.append(_grant_step(session, session.grant_id, runtime, fence))
    if session.scratch_prefix is not None:  # an empty prefix is refused by the guard, not ignored
        steps.append(_scratch_step(session, session.scratch_prefix, runtime, fence, calls))
    if session.connection_id and runtime.settings.registry_table:
        steps.append(_registry_step(session.connection_id, runtime.settings.registry_table, runtime, fence))
    return steps


def _connection_step(session: Session, attribute: str, runtime: Runtime, fence: Fence) -> Step:
    # The fence compares the live item's attribute with the old one (``attribute``); the call takes the id inside it.
    detail = {"connectionId": attribute}
    try:
        ident = connection_id_of(attribute, runtime.settings)
        endpoint = callback_endpoint(session.callback_url, runtime.settings)
    except PermanentError as exc:
        return Step(connection.ACTION, attribute, detail, refusal=exc)

    region = execute_api_region(endpoint)  # an execute-api endpoint is signed for its own region
    permit = fence.guard(connection.ACTION, attribute)

    def run(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
        management = runtime.clients.management(endpoint, region)
        return connection.close_connection(management, ident, deadline, permit=permit), {}

    return Step(connection.ACTION, attribute, {"connectionId": ident, "endpoint": endpoint}, run=run)


def _grant_step(session: Session, grant_id: str, runtime: Runtime, fence: Fence) -> Step:
    detail = {"grantId": grant_id}
    bound_to = session_id(session.pk, runtime.settings) if runtime.settings.session_binding else None
    try:
        key_id = grant_key(session.kms_key_id, runtime.settings)
        if runtime.settings.session_binding and bound_to is None:
            raise UnboundResourceError(
                f"the item's key names no session id, so grant {grant_id!r} cannot be bound to it and is kept: set "
                "SESSION_KEY_PREFIX to the key's prefix, or SESSION_BINDING=false if the table follows no such "
                "convention"
            )
    except PermanentError as exc:
        return Step(grant.ACTION, grant_id, detail, refusal=exc)
    permit = fence.guard(grant.ACTION, grant_id)
    kms = runtime.clients.kms
    name = grant.NameCheck(kms, key_id, grant_id, bound_to, late=fence.stale) if bound_to is not None else None

    def run(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
        return grant.retire_grant(kms, key_id, grant_id, deadline, permit=permit, name=name), {}

    def prepare(deadline: Deadline) -> None:
        if name is not None:
            name.start(runtime.side_executor, deadline)

    return Step(grant.ACTION, grant_id, {**detail, "keyId": key_id}, run=run, prepare=prepare)


def _scratch_step(
    session: Session, scratch_prefix: str, runtime: Runtime, fence: Fence, calls: BatchCalls | None
) -> Step:
    try:
        where = resolve_prefix(scratch_prefix, runtime.settings, session.tenant_id)
        if runtime.settings.session_binding:
            check_bound(where, session_id(session.pk, runtime.settings))
    except PermanentError as exc:
        return Step(scratch.ACTION, scratch_prefix, {"prefix": scratch_prefix}, refusal=exc)
    permit = fence.guard(scratch.ACTION, scratch_prefix, where, then=DELETE)

    def run(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
        versioned = runtime.is_versioned(where.bucket, deadline)
        together = calls.deleter(where.bucket) if calls is not None else None
        try:
            deleted = scratch.delete_prefix(
                runtime.clients.s3,
                where,
                versioned=versioned,
                deadline=deadline,
                permit=permit,
                together=together,
                beside=runtime.side_executor,
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


def _registry_step(held: str, table: str, runtime: Runtime, fence: Fence) -> Step:
    index, attribute = runtime.settings.registry_connection_index, runtime.settings.attributes.registry_connection_id
    try:
        connection_id = connection_id_of(held, runtime.settings)
    except PermanentError as exc:
        return Step(registry.ACTION, held, {"connectionId": held, "table": table}, refusal=exc)
    permit = fence.guard(registry.ACTION, held)

    def where(deadline: Deadline) -> registry.Registry:
        return registry.Registry(table, index, attribute, runtime.table_keys(table, deadline))

    def run(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
        wait = runtime.settings.retry_max_wait_seconds
        try:
            pruned = registry.prune(
                runtime.clients.dynamodb, where(deadline), connection_id, deadline, permit=permit, max_wait=wait
            )
        except NowHeldError as held:
            return ActionStatus.KEPT, {"heldBy": "live session", "memberships": held.deleted}
        return (ActionStatus.DONE if pruned.deleted else ActionStatus.ALREADY_DONE), _memberships(pruned)

    def preview(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
        found = registry.count(runtime.clients.dynamodb, where(deadline), connection_id, deadline)
        return ActionStatus.PLANNED, _memberships(found)

    detail = {"connectionId": connection_id, "table": table, "index": index}
    return Step(registry.ACTION, held, detail, run=run, preview=preview)


def _memberships(pruned: registry.Pruned) -> dict[str, Any]:
    return {"memberships": pruned.deleted, **({"kept": pruned.kept} if pruned.kept else {})}


def _unit(versioned: bool) -> str:
    return "versions" if versioned else "objects"


def execute(step: Step, runtime: Runtime, deadline: Deadline, fence: Fence, *, dry_run: bool = False) -> ActionResult:
    """Carry out ``step`` with retries; never raises for the worker's own errors, it returns a failed result.

    Its destructive calls go through ``fence``, which keeps what the live item under the same key holds (the step is
    then "kept"). A dry run asks the fence what it would keep, and frees nothing.
    """
    run = step.preview if dry_run else step.run
    retried = _retried(runtime, step, fence)
    try:
        # A step that will not run (refused, or only planned) is still "kept" when the live session holds it.
        if step.refusal is not None or dry_run or run is None:
            held = call_with_retry(lambda: _verdict(step, fence, deadline), runtime.settings, deadline, retried)
            if held is Holding.HELD:
                return ActionResult(action=step.action, status=ActionStatus.KEPT, detail=_HELD)
        if step.refusal is not None:
            return _failed(step, step.refusal, refused=True)
        if run is None:
            return ActionResult(action=step.action, status=ActionStatus.PLANNED, detail=step.detail)
        status, counts = call_with_retry(lambda: run(deadline), runtime.settings, deadline, on_retry=retried)
    except NowHeldError:
        return ActionResult(action=step.action, status=ActionStatus.KEPT, detail={**step.detail, **_HELD})
    except CleanupError as exc:
        fence.stale()
        return _failed(step, exc)
    return ActionResult(action=step.action, status=status, detail={**step.detail, **counts})


_HELD = {"heldBy": "live session"}


def _verdict(step: Step, fence: Fence, deadline: Deadline) -> Holding:
    held = fence.verdict(step.action, step.resource, step.location, deadline)
    if held is Holding.UNKNOWN:
        raise incomparable_prefix(step.resource, fence.live_prefix())
    return held


def _retried(runtime: Runtime, step: Step, fence: Fence) -> Callable[[BaseException], None]:
    def on_retry(exc: BaseException) -> None:
        fence.stale()  # a retried step reads the live item again before its next destructive call
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
