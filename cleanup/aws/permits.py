"""The send-time check: a request that frees a session's resource leaves only with a fresh permit for it.

A freeing request is one of ``FREEING_OPERATIONS`` (DeleteConnection, RetireGrant, RevokeGrant, DeleteObjects,
DeleteObject, a BatchWriteItem that deletes) or an operation an enabled action kind declares it frees with
(``SendCheck.declared``). Each one is checked at the last moment before it leaves, whichever client sends it:

* botocore's ``before-send`` (``check_request``), which runs after the pacer's waits for a turn and a slot
  (``cleanup.aws.pacing``) and again for every attempt, botocore's own retries included;
* the HTTP client of ``http-close`` (``cleanup.actions.bounded_http``), once connected, right before the request is
  written.

The check asks the ``Authority`` the caller bound to the call (``authorized``: the record's fence, through the
step's gate) for a ``Permit`` *at that moment*, so that the fence's read is taken after every wait, and refuses the
request, sending nothing, when:

* no authority is bound (a freeing call made outside a gate: a bug, logged at ERROR and reported to the observers);
* the permit does not cover what the request frees (the wrong grant, a key outside the page's prefix: a bug too);
* the permit's read answered longer ago than FENCE_READ_MAX_AGE_SECONDS (transient: the next try reads again);
* the authority keeps the resource (``NowHeldError``) or cannot read (its own error), as the fence decides.

What a request frees is named by ``targets``: ``grant:<id>``, ``connection:<id>``, ``s3:<bucket>/<key>``,
``dynamodb:<table>:<key>``, ``http:<url>``, or ``op:<service>.<Operation>`` for a declared operation. A permit covers
targets by exact name or by prefix (a scratch page's permit covers every key under its prefix).
"""

from __future__ import annotations

import bisect
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

from cleanup.exceptions import PermanentError, TransientError
from cleanup.telemetry import log

FREEING_OPERATIONS = frozenset(
    {"DeleteConnection", "RetireGrant", "RevokeGrant", "DeleteObjects", "DeleteObject", "BatchWriteItem"}
)
"""The built-in operations that free a session's resource (a BatchWriteItem only when it deletes)."""
TARGETS_KEY = "cleanup_targets"
"""Where a request's targets are kept in botocore's request context, from parameter building to sending."""


@dataclass(frozen=True)
class Permit:
    """Leave to send one freeing request: what it may free, and when the read that allowed it answered.

    ``read_at``: ``time.monotonic()`` when the read's answer arrived; None when nothing was read by the operator's
    choice (RACE_CHECK=false), which no age can make stale.
    """

    action: str
    covers: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()
    read_at: float | None = None
    reading: int = 0

    def allows(self, target: str) -> bool:
        if target in self.covers:
            return True
        ordered = self._ordered
        at = bisect.bisect_right(ordered, target)  # the greatest prefix not after it: its folder, among disjoint ones
        if at and target.startswith(ordered[at - 1]):
            return True
        return any(target.startswith(prefix) for prefix in self.prefixes)

    @cached_property
    def _ordered(self) -> list[str]:
        return sorted(self.prefixes)

    def age(self, now: float) -> float:
        return 0.0 if self.read_at is None else now - self.read_at

    @classmethod
    def joined(cls, permits: Iterable[Permit]) -> Permit:
        """One permit for a request that carries several (a DeleteObjects of several sessions' pages): it covers what
        each covers, and is as old as the oldest."""
        permits = list(permits)
        reads = [permit.read_at for permit in permits if permit.read_at is not None]
        return cls(
            action=",".join(sorted({permit.action for permit in permits})),
            covers=frozenset().union(*(permit.covers for permit in permits)),
            prefixes=tuple(prefix for permit in permits for prefix in permit.prefixes),
            read_at=min(reads) if reads else None,
        )


class Authority(Protocol):
    """What gives a freeing request its permit, asked at the moment it is sent (a step's gate)."""

    def authorize(self, deadline: Any) -> Permit:
        """A permit taken now, after every wait: a fresh read of the live item, or none needed.

        Raises:
            NowHeldError: the resource is kept.
            TransientError / PermanentError: the read failed, or its answer could not be understood.
        """
        ...


@dataclass(frozen=True)
class Own:
    """The authority for deleting what the worker itself stored (a dead-letter record, once redriven): no session's
    resource, so nothing is read; the permit covers exactly ``targets``. Whoever binds it has checked that they lie
    where the worker stores its own objects, outside the scratch root (``cleanup.queues.claim_check``)."""

    why: str
    targets: frozenset[str]

    def authorize(self, deadline: Any) -> Permit:
        return Permit(self.why, self.targets)


class RefusedSendError(PermanentError):
    """A freeing request carried no permit that covers it: nothing was sent. This is a bug of the call site."""


class StalePermitError(TransientError):
    """A freeing request's permit was read too long ago: nothing was sent, and the next try reads again."""


@dataclass(frozen=True)
class Violation:
    """A freeing request refused at the send (``why``); ``bug``: it carried no permit that covers it."""

    what: str
    targets: tuple[str, ...]
    why: str
    bug: bool


_authority: ContextVar[Authority | None] = ContextVar("cleanup_authority", default=None)
_observers: list[Callable[[Violation], None]] = []
_lock = threading.Lock()
_default_session_checked: list[SendCheck] = []


@contextmanager
def authorized(authority: Authority) -> Iterator[None]:
    """Freeing requests sent on this thread while the block runs take their permits from ``authority``."""
    token = _authority.set(authority)
    try:
        yield
    finally:
        _authority.reset(token)


@contextmanager
def unauthorized() -> Iterator[None]:
    """No authority while the block runs (a read made inside another call's permit is no freeing request's)."""
    token = _authority.set(None)
    try:
        yield
    finally:
        _authority.reset(token)


def check_default_session(send_check: SendCheck) -> None:
    """Check the freeing requests of every client made from boto3's default session from now on (``boto3.client``:
    a kind that is not built in, making clients of its own), once per process."""
    import boto3  # only where a kind that is not built in is enabled: the worker's own clients come from botocore

    with _lock:
        if _default_session_checked:
            _default_session_checked[0].declared.update(send_check.declared)
            return
        _default_session_checked.append(send_check)
        if boto3.DEFAULT_SESSION is None:
            boto3.setup_default_session()
        events = boto3.DEFAULT_SESSION.events  # type: ignore[union-attr]
    events.register("before-parameter-build", send_check.note_targets)
    events.register_last("before-send", send_check.before_send)


def default_check() -> SendCheck | None:
    """The check held to boto3's default session's clients, if one is (``check_default_session``)."""
    with _lock:
        return _default_session_checked[0] if _default_session_checked else None


@contextmanager
def observed(observer: Callable[[Violation], None]) -> Iterator[None]:
    """``observer`` is told of every refused send while the block runs (the test suite fails the test that made
    one)."""
    with _lock:
        _observers.append(observer)
    try:
        yield
    finally:
        with _lock:
            _observers.remove(observer)


def targets(
    service: str, operation: str, params: Mapping[str, Any], declared: frozenset[str] | set[str] = frozenset()
) -> tuple[str, ...] | None:
    """What a request frees, by its API parameters (``declared``: the operations enabled kinds free with); None when
    it frees nothing."""
    if operation in ("RetireGrant", "RevokeGrant"):
        return (f"grant:{params.get('GrantId')}",)
    if operation == "DeleteConnection":
        return (f"connection:{params.get('ConnectionId')}",)
    if operation == "DeleteObject":
        return (f"s3:{params.get('Bucket')}/{params.get('Key')}",)
    if operation == "DeleteObjects":
        objects = (params.get("Delete") or {}).get("Objects") or []
        return tuple(f"s3:{params.get('Bucket')}/{entry.get('Key')}" for entry in objects) or ("s3:?",)
    if operation == "BatchWriteItem":
        deletes = [
            f"dynamodb:{table}:{key_text(request['DeleteRequest'].get('Key'))}"
            for table, requests in (params.get("RequestItems") or {}).items()
            for request in requests or ()
            if isinstance(request, Mapping) and "DeleteRequest" in request
        ]
        return tuple(deletes) or None
    if f"{service}.{operation}" in declared:
        return (f"op:{service}.{operation}",)
    return None


def key_text(key: Any) -> str:
    """An item key as text equal for equal keys (a target's name)."""
    return json.dumps(key, sort_keys=True, default=str)


@dataclass
class SendCheck:
    """The check itself, with the bound on a permit's age, and the operations the enabled kinds declare they free with
    (``service.Operation``). On the worker's own clients a declared operation is checked when a gate is bound to it
    (the worker's own calls of it, a sweep's conditional DeleteItem, are no kind's); ``strict``: always (the clients
    a kind makes itself)."""

    max_age: float
    declared: set[str] = field(default_factory=set)
    strict: bool = False
    _clock: Callable[[], float] = field(default=time.monotonic)

    def frees(self, service: str, operation: str) -> bool:
        """Whether a request of ``operation`` needs a permit (and so is never sent again by botocore on one)."""
        if operation in FREEING_OPERATIONS:
            return True
        return f"{service}.{operation}" in self.declared and (self.strict or _authority.get() is not None)

    def note_targets(
        self, params: Mapping[str, Any], event_name: str, context: dict[str, Any] | None = None, **_: Any
    ) -> None:
        """botocore's ``before-parameter-build``: what the request will free, kept in its context for the send."""
        if context is None:
            return
        service, operation = event_name.split(".")[1:3]
        if self.frees(service, operation):
            found = targets(service, operation, params, self.declared)
            if found is not None:
                context[TARGETS_KEY] = found

    def check(self, what: str, found: tuple[str, ...], deadline: Any) -> Permit:
        """The permit for a request freeing ``found`` (``what``: the operation, for messages), taken now.

        Raises:
            RefusedSendError: no authority, or a permit that does not cover every target.
            StalePermitError: the permit's read is older than ``max_age``.
            NowHeldError / TransientError / PermanentError: the authority keeps the resource.
        """
        authority = _authority.get()
        if authority is None:
            raise self._refuse(RefusedSendError, what, found, "no permit: a freeing call made outside its gate")
        permit = authority.authorize(deadline)
        uncovered = [target for target in found if not permit.allows(target)]
        refusal: Exception | None = None
        if uncovered:
            why = f"the permit of {permit.action!r} does not cover {', '.join(uncovered[:3])}"
            refusal = self._refuse(RefusedSendError, what, found, why)
        elif (age := permit.age(self._clock())) > self.max_age:
            why = f"the permit's read is {age * 1000:.0f} ms old (FENCE_READ_MAX_AGE_SECONDS {self.max_age:g})"
            refusal = self._refuse(StalePermitError, what, found, why)
        if refusal is not None:
            note = getattr(authority, "refuse", None)  # the gate judges its step by it, whatever the step returns
            if note is not None:
                note(refusal)
            raise refusal
        return permit

    def before_send(self, request: Any, event_name: str, **_: Any) -> None:
        """botocore's ``before-send`` for a client the pacer does not attach to: the check alone."""
        service, operation = event_name.split(".")[1:3]
        self.check_request(service, operation, request, None)

    def check_request(self, service: str, operation: str, request: Any, deadline: Any) -> Permit | None:
        """The check of one botocore attempt (None: it frees nothing)."""
        context = getattr(request, "context", None) or {}
        found = context.get(TARGETS_KEY)
        if found is None:
            return None
        return self.check(operation, found, deadline)

    def attach(self, client: Any) -> None:
        """Check every freeing request ``client`` sends (the pacer attaches its own clients: ``Pacer.attach``)."""
        client.meta.events.register("before-parameter-build", self.note_targets)
        client.meta.events.register_last("before-send", self.before_send)

    def _refuse(self, error: type[Exception], what: str, found: tuple[str, ...], why: str) -> Exception:
        violation = Violation(what, found, why, bug=error is RefusedSendError)
        log.error("freeing call refused at the send", extra={"operation": what, "targets": list(found[:5]), "why": why})
        with _lock:
            observers = list(_observers)
        for observer in observers:
            observer(violation)
        return error(f"{what}: refused at the send: {why}; nothing was sent")
