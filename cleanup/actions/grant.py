"""Retire the session's KMS grant.

The grant must name the worker's role as its retiring principal (CreateGrant ``RetiringPrincipal``), and ``KeyId``
must be the key's ARN: RetireGrant does not accept a bare key id or an alias.

With SESSION_BINDING on, the grant is retired only if its Name is its session's (``session:<id>``, as
``create_session_grant`` names it): one ListGrants by key and grant id (``NameCheck``), sent when the record's
cleanup starts, beside its first calls, so that its answer is there when the socket's reading lets the grant go with
the socket's call. A grant's name never changes, so the answer holds until the RetireGrant, and the fence's permit
stays right before it; an answer that came only after that reading was taken (or a check made again, on a retry)
makes the permit read again. KMS quotas ListGrants apart from RetireGrant, and so does ``cleanup.aws.pacing``
(``RATED_APART``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING, Any

from cleanup.actions.api import ActionKind, Context, Gate, Holding, Host, Orphan, Step
from cleanup.aws.calls import call_or_gone
from cleanup.aws.retry import Deadline
from cleanup.core.guard import grant_key, session_id
from cleanup.exceptions import PermanentError, TransientError, UnboundResourceError
from cleanup.expiry.convention import grant_name
from schemas.outcomes import ActionStatus
from schemas.session import Session

if TYPE_CHECKING:
    from mypy_boto3_kms import KMSClient

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


def bound(kms: KMSClient, key_id: str, grant_id: str, session_id: str, deadline: Deadline) -> bool:
    """Whether ``grant_id`` is still there to retire, as ``session_id``'s (one ListGrants by key and grant id).

    False when the grant is not listed: it was retired already (a grant created moments ago that ListGrants does not
    show yet is left to ``cleanup-worker reconcile``, which finds it by its name).

    Raises:
        UnboundResourceError: the grant's Name is not ``session:<session_id>``.
        TransientError / PermanentError: ListGrants failed (a key that is not found: the grant is gone with it).
    """
    found = call_or_gone(
        kms.list_grants, "ListGrants", deadline, ("NotFoundException",), KeyId=key_id, GrantId=grant_id
    )
    if found is None:  # the key is not found: nor is its grant
        return False
    if "Grants" not in found:  # an empty or cut body, read as {}: not "no such grant"
        raise TransientError(f"ListGrants: an answer without a list of grants: cannot tell whose {grant_id!r} is")
    grants = [grant for grant in found["Grants"] if grant.get("GrantId") == grant_id]
    if not grants:
        return False
    expected, name = grant_name(session_id), grants[0].get("Name", "")
    if name != expected:
        raise UnboundResourceError(
            f"grant {grant_id!r} is named {name!r}, not {expected!r}: it is not bound to this session and is kept. "
            "If the table's grants are not named by the write path's convention, set SESSION_BINDING=false; else "
            "find who wrote this item"
        )
    return True


class NameCheck:
    """Whether a grant is bound to its session (``bound``), asked early (``start``) and answered when the grant is
    about to be retired (``answer``)."""

    def __init__(
        self, kms: KMSClient, key_id: str, grant_id: str, session_id: str, *, late: Callable[[], None]
    ) -> None:
        """``late``: makes the next permit read the item again (``Fence.stale``), for an answer that came late."""
        self._ask = (kms, key_id, grant_id, session_id)
        self._late = late
        self._early: Future[bool] | None = None

    def start(self, executor: Executor, deadline: Deadline) -> None:
        """Send the ListGrants on ``executor`` now, before the record's first read."""
        self._early = executor.submit(bound, *self._ask, deadline)

    def answer(self, deadline: Deadline) -> bool:
        """``bound``'s answer: the early one if it is already there, else one waited for (or asked now, if the early
        one has not started: it may wait behind this thread's own pool), after which the permit reads again.

        Raises:
            UnboundResourceError / TransientError / PermanentError: as ``bound``.
        """
        early, self._early = self._early, None
        if early is not None and early.done():
            return early.result()
        # A running one is bounded by its own call's deadline and timeouts; one not started is asked here instead.
        answered = early.result() if early is not None and not early.cancel() else bound(*self._ask, deadline)
        self._late()
        return answered


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
        detail = {"grantId": grant_id}
        bound_to = session_id(session.pk, runtime.settings) if runtime.settings.session_binding else None
        try:
            key_id = grant_key(session.kms_key_id, runtime.settings)
            if runtime.settings.session_binding and bound_to is None:
                raise UnboundResourceError(
                    f"the item's key names no session id, so grant {grant_id!r} cannot be bound to it and is kept: "
                    "set SESSION_KEY_PREFIX to the key's prefix, or SESSION_BINDING=false if the table follows no "
                    "such convention"
                )
        except PermanentError as exc:
            return [self.step(grant_id, detail, refusal=exc)]
        gate = self.gate(context, grant_id)
        kms = runtime.clients.kms
        name = NameCheck(kms, key_id, grant_id, bound_to, late=fence.stale) if bound_to is not None else None

        def run(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
            return retire_grant(kms, key_id, grant_id, deadline, permit=gate, name=name), {}

        def prepare(deadline: Deadline) -> None:
            if name is not None:
                name.start(runtime.side_executor, deadline)

        return [self.step(grant_id, {**detail, "keyId": key_id}, run=run, prepare=prepare)]

    def free_orphans(self, orphans: Sequence[Orphan], gate: Gate, host: Host, deadline: Deadline) -> ActionStatus:
        [orphan] = orphans
        if not isinstance(orphan.location, str):
            raise PermanentError(f"grant {orphan.resource!r}: no key to retire it on")
        return retire_grant(host.clients.kms, orphan.location, orphan.resource, deadline, permit=gate)

    def holding(self, resource: str, live: Session, location: Any) -> Holding:
        return Holding.HELD if live.grant_id == resource else Holding.FREE

    def covering(self, resource: str, location: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return (f"grant:{resource}",), ()
