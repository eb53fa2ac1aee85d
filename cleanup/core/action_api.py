"""The action API: what one kind of resource declares so that it is freed behind the one fence.

A kind (``ActionKind``) declares, without any I/O:

* ``name``: its wire name, as it appears in ACTIONS, in outcomes, in backlog messages and dead letters;
* ``owns`` and ``reads``: the image attributes it identifies its resource by, and those it only reads, each named as
  a field of ``AttributeNames`` (so that ``ATTR_*`` keeps renaming them);
* ``holding``: whether the live item now under the deleted one's key still holds a step's resource (``Holding``:
  free, held, or cannot tell, which keeps);
* ``plan``: its steps for one session;
* ``gone``: the error codes meaning its resource is already gone (idempotent success);
* ``paced_by``: the service whose quota paces its freeing calls (``cleanup.aws.pacing``);
* ``free_orphans`` (optional): how it frees resources found without their session's record (``cleanup-worker
  reconcile``), behind the same fence.

A step reaches a freeing call only through its ``Gate``, made by the record's fence, and the permit is asked where the
call leaves, after every wait (``cleanup.aws.permits``): ``Gate.aws`` sends an AWS request with the process's clients
(the way a kind that is not built in frees: it is given only read-only clients, ``ReadOnlyClients``), ``Gate.sending``
binds the gate to the AWS requests a built-in kind sends itself, and ``Gate.call`` asks the permit right before a call
the worker cannot see leave (a Redis command, say). A kind that catches every exception around its gate still frees
nothing without a permit, and the host reports it by what the gate saw, not by what the kind returns (a refusal it
swallowed, a success with no permit given).

A kind may also declare:

* ``names``: the ``AttributeNames`` fields that name its resource (default: ``owns``), and ``attributes``: item
  attributes of its own (not ``ATTR_*``) that do. An item holding any enabled kind's is a session; the fence reads them
  all; messages keep them;
* ``frees``: the operations it frees with (``service.Operation``) besides the built-in ones, each checked at the send
  and never sent again by botocore on one permit.

The host (``cleanup.core.plan`` and ``cleanup.core.pipeline``) orders the steps, classifies what they return or raise
(any exception a kind raises is that kind's failure, transient unless it is a ``PermanentError``), bounds a kind that
is not built in by the record's deadline, and keeps the logs, metrics and message formats.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, ClassVar, ParamSpec, Protocol, TypeVar

from botocore import xform_name

from cleanup.aws.calls import call_or_gone
from cleanup.aws.clients import Clients
from cleanup.aws.coalesce import READ, Coalescer
from cleanup.aws.permits import Permit, authorized, targets
from cleanup.deadline import Deadline
from cleanup.exceptions import PermanentError, TransientError
from schemas.outcomes import ActionStatus
from schemas.session import Session
from schemas.settings import Settings

API_VERSION = 2
"""The API's major version: a kind declaring another one is refused at start."""

P = ParamSpec("P")
R = TypeVar("R")


class Holding(Enum):
    """Whether the live item still holds a step's resource."""

    FREE = "free"  # no live item, or it holds something else: go ahead
    HELD = "held"  # the live session uses it: keep it
    UNKNOWN = "unknown"  # the live item's value cannot be compared: keep it, and report the step


Ask = Callable[[Deadline, Any], Permit]
"""The fence's permit for one step: asked with a deadline (and a reading taken with other records', or None)."""


class Gate:
    """A step's only route to its freeing calls, and the authority their permits are asked of where they leave.

    It keeps what it gave and refused (``granted``, ``refusal``), so that the host judges a step by what happened at its
    gate, whatever the step returns.
    """

    def __init__(self, ask: Ask, action: str = "", sender: Sender | None = None, max_age: float = 0.25) -> None:
        self._ask = ask
        self.action = action
        self.max_age = max_age
        self._sender = sender
        self._deadline = Deadline()
        self._lock = threading.Lock()
        self.granted = 0
        self.refusal: BaseException | None = None
        self._naming: frozenset[str] = frozenset()
        self._closed: str | None = None
        self.fence: Any = None
        """The record's fence that made it (``cleanup.core.fence``): several gates' permits may be read together."""

    def authorize(self, deadline: Deadline | None = None) -> Permit:
        """A permit taken now (``cleanup.aws.permits.Authority``), with this gate's deadline when none is given.

        Raises:
            NowHeldError / TransientError / PermanentError: the fence keeps the resource.
        """
        return self._asked(deadline or self._deadline, None)

    def authorize_on(self, reading: Any, deadline: Deadline) -> Permit:
        """A permit on ``reading``, taken for this gate's record together with other records' (one request)."""
        return self._asked(deadline, reading)

    def close(self, why: str) -> None:
        """Give no permit from now on (a step still running past its bound): each ask is refused with ``why``."""
        with self._lock:
            self._closed = why

    def _asked(self, deadline: Deadline, reading: Any) -> Permit:
        try:
            if self._closed is not None:
                raise TransientError(self._closed)
            permit = self._ask(deadline, reading)
        except BaseException as exc:
            with self._lock:
                self.refusal = exc
            raise
        with self._lock:
            self.granted += 1
        if self._naming:  # a request this gate sends itself: its permit covers what it names
            permit = replace(permit, covers=permit.covers | self._naming)
        return permit

    def refuse(self, error: BaseException) -> None:
        """Note a refusal made for this gate elsewhere (a read taken together with other records' failed)."""
        with self._lock:
            self.refusal = error

    def reset(self) -> None:
        """Forget what was given and refused (before a step is tried again)."""
        with self._lock:
            self.granted, self.refusal = 0, None

    @contextmanager
    def sending(self, deadline: Deadline) -> Iterator[None]:
        """The freeing AWS requests sent on this thread while the block runs take their permits from this gate, each
        where it leaves, after its waits."""
        self._deadline = deadline
        with authorized(self):
            yield

    def call(self, deadline: Deadline, method: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """``method(*args, **kwargs)``, once a permit asked right before it is given: for a freeing call that is no
        AWS request (those are asked where they leave: ``aws``, ``sending``); an AWS request it makes is asked again.

        Raises:
            NowHeldError / PermanentError / TransientError: the permit keeps the resource; nothing is called.
        """
        self.authorize(deadline)
        with self.sending(deadline):
            return method(*args, **kwargs)

    def aws(
        self,
        deadline: Deadline,
        service: str,
        operation: str,
        /,
        *,
        endpoint: str | None = None,
        region: str | None = None,
        gone: Collection[str] = (),
        **params: Any,
    ) -> Any:
        """Send ``operation`` (``"BatchWriteItem"``) of ``service`` (``"dynamodb"``) with the process's clients, its
        permit asked where it leaves; None when AWS answers an error code (or HTTP status) of ``gone``.

        Raises:
            NowHeldError: the permit keeps the resource; nothing was sent.
            TransientError / PermanentError: the call failed (``cleanup.aws.calls``).
        """
        if self._sender is None:
            raise PermanentError(f"{self.action}: this gate sends nothing itself")
        self._naming = frozenset(targets(service, operation, params, {f"{service}.{operation}"}) or ())
        try:
            with self.sending(deadline):
                return self._sender.aws(deadline, service, operation, endpoint, region, gone, params)
        finally:
            self._naming = frozenset()


class Sender(Protocol):
    """How a gate sends an AWS request (``Gate.aws``): the host's clients."""

    def aws(
        self,
        deadline: Deadline,
        service: str,
        operation: str,
        endpoint: str | None,
        region: str | None,
        gone: Collection[str],
        params: dict[str, Any],
    ) -> Any: ...


class ClientSender:
    """``Sender`` with the process's clients: a request made as the built-in kinds make theirs (paced, translated), so
    that its permit is asked where it leaves; the permit covers what the request names (``permits.targets``)."""

    def __init__(self, clients: Clients) -> None:
        self._clients = clients

    def aws(
        self,
        deadline: Deadline,
        service: str,
        operation: str,
        endpoint: str | None,
        region: str | None,
        gone: Collection[str],
        params: dict[str, Any],
    ) -> Any:
        if service == "apigatewaymanagementapi":
            if endpoint is None:
                raise PermanentError(f"{operation}: the management API needs the connection's endpoint")
            client = self._clients.management(endpoint, region)
        else:
            client = self._clients.get(service, endpoint)
        method = getattr(client, xform_name(operation), None)
        if method is None:
            raise PermanentError(f"{service} has no operation {operation!r}")
        return call_or_gone(method, operation, deadline, gone, **params)


READ_VERBS = ("Get", "List", "Describe", "Query", "Scan", "BatchGet", "Head")
"""Operations a kind may send without its gate: they read."""


class ReadOnlyClient:
    """A client that sends only operations that read (``READ_VERBS``); any other is refused before it is made."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._operations: dict[str, str] = dict(client.meta.method_to_api_mapping)

    def __getattr__(self, name: str) -> Any:
        operation = self._operations.get(name)
        if operation is not None and not operation.startswith(READ_VERBS):
            raise PermanentError(f"{operation}: not a read; a kind frees only through its gate (Gate.aws)")
        if operation is None and name not in ("get_paginator", "can_paginate", "exceptions"):
            raise AttributeError(name)
        return getattr(self._client, name)


class ReadOnlyClients:
    """The process's clients as a kind that is not built in gets them: reads only."""

    def __init__(self, clients: Clients) -> None:
        self._clients = clients

    def get(self, service: str, endpoint_url: str | None = None) -> Any:
        return ReadOnlyClient(self._clients.get(service, endpoint_url))

    def management(self, callback_url: str, region: str | None = None) -> Any:
        return ReadOnlyClient(self._clients.management(callback_url, region))

    def __getattr__(self, service: str) -> Any:
        names = {"dynamodb": "dynamodb", "s3": "s3", "kms": "kms", "sqs": "sqs", "streams": "dynamodbstreams"}
        if service not in names:
            raise AttributeError(service)
        return self.get(names[service])


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
    location: Any = None  # what the kind compares the live item with besides ``resource`` (scratch: where it deletes)
    prepare: Callable[[Deadline], None] | None = None  # read-only calls sent when the record's cleanup starts
    kind: ActionKind = field(kw_only=True)  # whose step: how the fence tells whether the live item holds it


@dataclass(frozen=True)
class Orphan:
    """A resource found without its session's record (reconcile): ``resource`` as the kind's steps name it, and
    ``location``, what else the kind frees it by (a grant's key, a prefix's bucket, a membership's item key)."""

    resource: str
    location: Any = None


class Host(Protocol):
    """What a kind may use of the process's runtime (``cleanup.runtime.Runtime``; a kind that is not built in gets
    read-only clients)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def clients(self) -> Any: ...
    @property
    def side_executor(self) -> Executor: ...
    def is_versioned(self, bucket: str, deadline: Deadline | None = None) -> bool: ...
    def table_keys(self, table: str, deadline: Deadline | None = None) -> tuple[str, ...]: ...


class Guard(Protocol):
    """What a kind may use of its record's fence (``cleanup.core.fence.Fence``)."""

    def guard(
        self, kind: ActionKind, resource: str, location: Any = None, then: str = READ, *, sender: Sender | None = None
    ) -> Gate: ...
    def stale(self) -> None: ...


class Shared(Protocol):
    """The batch's shared calls (``cleanup.actions.batch_calls.BatchCalls``)."""

    def deleter(self, bucket: str) -> Coalescer[Any, int]: ...
    def head(self, stage: str | None) -> None: ...


@dataclass(frozen=True)
class Context:
    """What a kind plans with: the process's runtime, the record's fence, the batch's shared calls, and how its gates
    send (``Gate.aws``)."""

    runtime: Host
    fence: Guard
    calls: Shared | None = None
    sender: Sender | None = None


class ActionKind(ABC):
    """One kind of resource a session holds (see the module's docstring). Made once per settings, with them."""

    name: ClassVar[str]
    api_version: ClassVar[int] = API_VERSION
    owns: ClassVar[tuple[str, ...]] = ()
    """``AttributeNames`` fields that identify this kind's resource (no other kind may own them)."""
    reads: ClassVar[tuple[str, ...]] = ()
    """``AttributeNames`` fields it only reads (they may be another kind's)."""
    names: ClassVar[tuple[str, ...] | None] = None
    """``AttributeNames`` fields that name its resource (None: ``owns``): an item holding one is a session."""
    attributes: ClassVar[tuple[str, ...]] = ()
    """Item attributes of its own (as stored, not ``ATTR_*`` names) that name its resource: read by the fence, kept in
    messages, and making an item that holds one a session."""
    frees: ClassVar[tuple[str, ...]] = ()
    """Operations it frees with besides the built-in ones (``service.Operation``, e.g. ``dynamodb.DeleteItem``): each
    is checked where it leaves (``cleanup.aws.permits``)."""
    paced_by: ClassVar[str]
    gone: ClassVar[frozenset[str]] = frozenset()
    phase: ClassVar[int] = 2
    """When its steps run: 0 first (before the others), 1 together on one read, 2 after."""
    together: ClassVar[bool] = False
    """Whether its first call goes out with those of the other ``together`` kinds, on one read."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @abstractmethod
    def plan(self, session: Session, context: Context) -> Sequence[Step]:
        """The steps that free this kind's resources of ``session`` (none when it holds none)."""

    @abstractmethod
    def holding(self, resource: str, live: Session, location: Any) -> Holding:
        """Whether ``live`` (the item now under the deleted one's key) still holds a step's resource; no I/O."""

    def unknown(self, resource: str, live: Session) -> PermanentError:
        """The error reported when ``holding`` cannot tell (the resource is kept)."""
        return PermanentError(f"the live session under the same key cannot be compared with {resource!r}: kept")

    def free_orphans(self, orphans: Sequence[Orphan], gate: Gate, host: Host, deadline: Deadline) -> ActionStatus:
        """Free resources found without their session's record (one, or one group that is freed together), every
        destructive call through ``gate``: DONE, or ALREADY_DONE when they were gone.

        Raises:
            PermanentError: this kind frees nothing found so (the default).
        """
        raise PermanentError(f"{self.name!r} frees nothing found without its session's record")

    def step(self, resource: str, detail: dict[str, Any], **parts: Any) -> Step:
        """A step of this kind."""
        return Step(self.name, resource, detail, kind=self, **parts)

    def gate(self, context: Context, resource: str, location: Any = None, then: str = READ) -> Gate:
        """The gate of one step's freeing calls (``then``: the stage the thread heads to after the read): its permits
        cover what ``covering`` names, and what each request sent by ``Gate.aws`` names."""
        return context.fence.guard(self, resource, location, then=then, sender=context.sender)

    def covering(self, resource: str, location: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """What a permit for ``resource`` covers, by name and by prefix (``cleanup.aws.permits``: ``grant:<id>``,
        ``s3:<bucket>/<prefix>``, ...); a kind that frees only through ``Gate.aws`` needs none."""
        return (), ()

    @classmethod
    def naming(cls) -> tuple[str, ...]:
        """The ``AttributeNames`` fields that name this kind's resource."""
        return cls.owns if cls.names is None else cls.names
