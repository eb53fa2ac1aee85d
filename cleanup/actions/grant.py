"""Retire the session's KMS grant.

The grant must name the worker's role as its retiring principal (CreateGrant ``RetiringPrincipal``), and ``KeyId``
must be the key's ARN: RetireGrant does not accept a bare key id or an alias.

With SESSION_BINDING (``own`` by default, or ``strict``), the grant is retired only if it is bound to its session: one
ListGrants by key and grant id (``NameCheck``) reads its Name and retiring principal. ``strict``: the Name is its
session's (``session:<id>``, as ``create_session_grant`` names it). ``own``: that, or no Name at all and this worker
as its retiring principal (a grant made for this worker to retire); a grant named for another session, named
otherwise, or unnamed and retired by some other principal is kept. The worker's own principal is asked of STS once
per process (GetCallerIdentity, which needs no permission), only when an unnamed grant is met.

The ListGrants is sent when the record's cleanup starts, beside its first calls, so that its answer is there when the
socket's reading lets the grant go with the socket's call. A grant's name and retiring principal never change, so the
answer holds until the RetireGrant, and the fence's permit stays right before it; an answer that came only after that
reading was taken (or a check made again, on a retry) makes the permit read again. A dry run asks the same (read-only)
and reports the grants it would keep as unbound. KMS quotas ListGrants apart from RetireGrant, and so does
``cleanup.aws.pacing`` (``RATED_APART``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING, Any

from cleanup.actions.binding import judge, worker_principal
from cleanup.aws.calls import call_or_gone
from cleanup.core.action_api import ActionKind, Context, Gate, Holding, Host, Orphan, Step
from cleanup.core.guard import grant_key, session_id
from cleanup.deadline import Deadline
from cleanup.exceptions import PermanentError, TransientError, UnboundResourceError
from schemas.outcomes import ActionStatus
from schemas.session import Session
from schemas.settings import Binding

if TYPE_CHECKING:
    from mypy_boto3_kms import KMSClient
    from mypy_boto3_kms.type_defs import GrantListEntryTypeDef

ACTION = "grant"
GONE = ("NotFoundException",)


def retire_grant(
    kms: KMSClient,
    key_id: str,
    grant_id: str,
    deadline: Deadline | None = None,
    *,
    permit: Gate,
    name: NameCheck | None = None,
) -> ActionStatus:
    """Retire ``grant_id`` on ``key_id``, with the permit of ``permit`` (its gate) asked where the call leaves
    (``cleanup.aws.permits``), and, given ``name``, only if the grant is bound to its session. A grant that is not
    found (already retired or revoked) counts as retired.

    Raises:
        NowHeldError: ``permit`` keeps the grant (a live session holds it).
        UnboundResourceError: the grant is named for another session, or not at all: it is kept.
        TransientError: throttling, KMS internal errors, timeouts.
        PermanentError: access denied, invalid grant id, key disabled or pending deletion, and anything else.
    """
    deadline = deadline or Deadline()
    if name is not None and not name.answer(deadline):
        return ActionStatus.ALREADY_DONE
    with permit.sending(deadline):
        retired = call_or_gone(kms.retire_grant, "RetireGrant", deadline, GONE, KeyId=key_id, GrantId=grant_id)
    return ActionStatus.ALREADY_DONE if retired is None else ActionStatus.DONE


def bound(
    kms: KMSClient,
    key_id: str,
    grant_id: str,
    session_id: str | None,
    deadline: Deadline,
    *,
    binding: Binding = Binding.STRICT,
    worker: Callable[[Deadline], str] | None = None,
) -> bool:
    """Whether ``grant_id`` is still there to retire, bound to ``session_id`` under ``binding`` (one ListGrants by
    key and grant id; ``worker`` gives this worker's own principal, asked only for an unnamed grant under ``own``).

    False when the grant is not listed: it was retired already (a grant created moments ago that ListGrants does not
    show yet is left to ``cleanup-worker reconcile``, which finds it by its name).

    Raises:
        UnboundResourceError: the grant is not bound to the session (see the module's docstring).
        TransientError / PermanentError: ListGrants or GetCallerIdentity failed (a key that is not found: the grant
            is gone with it).
    """
    grant = listed(kms, key_id, grant_id, deadline)
    if grant is None:
        return False
    judge(grant, grant_id, session_id, binding, (lambda: worker(deadline)) if worker is not None else (lambda: ""))
    return True


def listed(kms: KMSClient, key_id: str, grant_id: str, deadline: Deadline | None) -> GrantListEntryTypeDef | None:
    """``grant_id`` as ListGrants (by key and grant id) lists it, or None when it is not listed (retired already, or
    its key is not found).

    Raises:
        TransientError / PermanentError: ListGrants failed, or answered without a list of grants.
    """
    found = call_or_gone(
        kms.list_grants, "ListGrants", deadline, ("NotFoundException",), KeyId=key_id, GrantId=grant_id
    )
    if found is None:  # the key is not found: nor is its grant
        return None
    if "Grants" not in found:  # an empty or cut body, read as {}: not "no such grant"
        raise TransientError(f"ListGrants: an answer without a list of grants: cannot tell whose {grant_id!r} is")
    return next((grant for grant in found["Grants"] if grant.get("GrantId") == grant_id), None)


class NameCheck:
    """Whether a grant is bound to its session (``bound``), asked early (``start``) and answered when the grant is
    about to be retired (``answer``), or for a dry run (``preview``)."""

    def __init__(
        self,
        kms: KMSClient,
        key_id: str,
        grant_id: str,
        session_id: str | None,
        *,
        late: Callable[[], None],
        binding: Binding = Binding.STRICT,
        worker: Callable[[Deadline], str] | None = None,
        unbound: Callable[[], None] = lambda: None,
    ) -> None:
        """``late``: makes the next permit read the item again (``Fence.stale``), for an answer that came late;
        ``unbound``: notes that the grant is kept as not bound (before the error is raised)."""
        self._ask = (kms, key_id, grant_id, session_id)
        self._rule = {"binding": binding, "worker": worker}
        self._late = late
        self._unbound = unbound
        self._early: Future[bool] | None = None

    def _bound(self, deadline: Deadline) -> bool:
        return bound(*self._ask, deadline, **self._rule)  # type: ignore[arg-type]

    def start(self, executor: Executor, deadline: Deadline) -> None:
        """Send the ListGrants on ``executor`` now, before the record's first read."""
        self._early = executor.submit(self._bound, deadline)

    def answer(self, deadline: Deadline) -> bool:
        """``bound``'s answer: the early one if it is already there, else one waited for (or asked now, if the early
        one has not started: it may wait behind this thread's own pool), after which the permit reads again.

        Raises:
            UnboundResourceError / TransientError / PermanentError: as ``bound``.
        """
        early, self._early = self._early, None
        try:
            if early is not None and early.done():
                return early.result()
            # A running one is bounded by its own call's deadline and timeouts; one not started is asked here instead.
            answered = early.result() if early is not None and not early.cancel() else self._bound(deadline)
        except UnboundResourceError:
            self._unbound()
            raise
        self._late()
        return answered

    def preview(self, deadline: Deadline) -> bool:
        """``bound``'s answer for a dry run (read-only: nothing is retired after it)."""
        try:
            return self._bound(deadline)
        except UnboundResourceError:
            self._unbound()
            raise


class Grant(ActionKind):
    """The session's KMS grant (``ATTR_GRANT_ID``, on ``ATTR_KMS_KEY_ID`` or KMS_KEY_ID)."""

    name = ACTION
    owns = ("grant_id", "kms_key_id")
    reads = ("pk",)
    paced_by = "kms"
    gone = frozenset(GONE)
    phase = 1
    together = True

    def plan(self, session: Session, context: Context) -> Sequence[Step]:
        if not session.grant_id:
            return []
        grant_id, runtime, fence = session.grant_id, context.runtime, context.fence
        detail: dict[str, Any] = {"grantId": grant_id}
        binding = runtime.settings.session_binding
        bound_to = session_id(session.pk, runtime.settings) if binding is not Binding.OFF else None
        try:
            key_id = grant_key(session.kms_key_id, runtime.settings)
            if binding is Binding.STRICT and bound_to is None:
                raise UnboundResourceError(
                    f"the item's key names no session id, so grant {grant_id!r} cannot be bound to it and is kept: "
                    "set SESSION_KEY_PREFIX to the key's prefix, or SESSION_BINDING=own (or off) if the table "
                    "follows no such convention"
                )
        except PermanentError as exc:
            unbound = {"unbound": True} if isinstance(exc, UnboundResourceError) else {}
            return [self.step(grant_id, {**detail, **unbound}, refusal=exc)]
        gate = self.gate(context, grant_id)
        kms = runtime.clients.kms
        detail["keyId"] = key_id
        name = (
            NameCheck(
                kms,
                key_id,
                grant_id,
                bound_to,
                late=fence.stale,
                binding=binding,
                worker=worker_principal(runtime.clients),
                unbound=lambda: detail.__setitem__("unbound", True),  # the step's own detail: counted when it fails
            )
            if binding is not Binding.OFF
            else None
        )

        def run(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
            return retire_grant(kms, key_id, grant_id, deadline, permit=gate, name=name), {}

        def prepare(deadline: Deadline) -> None:
            if name is not None:
                name.start(runtime.side_executor, deadline)

        def preview(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
            there = name is None or name.preview(deadline)
            return (ActionStatus.PLANNED if there else ActionStatus.ALREADY_DONE), {}

        return [self.step(grant_id, detail, run=run, prepare=prepare, preview=preview)]

    def free_orphans(self, orphans: Sequence[Orphan], gate: Gate, host: Host, deadline: Deadline) -> ActionStatus:
        [orphan] = orphans
        if not isinstance(orphan.location, str):
            raise PermanentError(f"grant {orphan.resource!r}: no key to retire it on")
        return retire_grant(host.clients.kms, orphan.location, orphan.resource, deadline, permit=gate)

    def holding(self, resource: str, live: Session, location: Any) -> Holding:
        return Holding.HELD if live.grant_id == resource else Holding.FREE

    def covering(self, resource: str, location: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return (f"grant:{resource}",), ()
