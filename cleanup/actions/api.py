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

A step reaches a destructive call only through its ``Gate``, made by the record's fence: ``Gate.call`` asks the
fence's permit and only then makes the call, so a kind that catches every exception around it still frees nothing
without a permit. The host (``cleanup.core.plan`` and ``cleanup.core.pipeline``) orders the steps, classifies what they
return or raise, and keeps the logs, metrics and message formats.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, ParamSpec, Protocol, TypeVar

from cleanup.aws.clients import Clients
from cleanup.aws.coalesce import READ, Coalescer
from cleanup.aws.retry import Deadline
from cleanup.exceptions import PermanentError
from schemas.outcomes import ActionStatus
from schemas.session import Session
from schemas.settings import Settings

API_VERSION = 1
"""The API's major version: a kind declaring another one is refused at start."""

P = ParamSpec("P")
R = TypeVar("R")


class Holding(Enum):
    """Whether the live item still holds a step's resource."""

    FREE = "free"  # no live item, or it holds something else: go ahead
    HELD = "held"  # the live session uses it: keep it
    UNKNOWN = "unknown"  # the live item's value cannot be compared: keep it, and report the step


Permit = Callable[[Deadline], None]
"""Asked right before a destructive call: returns to let it go, raises to keep the resource."""


class Gate:
    """A step's only route to a destructive call: ``call`` asks the permit, then makes the call."""

    def __init__(self, permit: Permit) -> None:
        self._permit = permit

    def call(self, deadline: Deadline, method: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """``method(*args, **kwargs)``, once the permit lets it; the permit's refusal is raised and nothing is called.

        Raises:
            NowHeldError / PermanentError / TransientError: the permit keeps the resource (``cleanup.core.fence``).
        """
        self._permit(deadline)
        return method(*args, **kwargs)


def gate_of(permit: Permit | Gate) -> Gate:
    """``permit`` as a gate (a permit callable is wrapped)."""
    return permit if isinstance(permit, Gate) else Gate(permit)


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
    """What a kind may use of the process's runtime (``cleanup.runtime.Runtime``)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def clients(self) -> Clients: ...
    @property
    def side_executor(self) -> Executor: ...
    def is_versioned(self, bucket: str, deadline: Deadline | None = None) -> bool: ...
    def table_keys(self, table: str, deadline: Deadline | None = None) -> tuple[str, ...]: ...


class Guard(Protocol):
    """What a kind may use of its record's fence (``cleanup.core.fence.Fence``)."""

    def guard(self, kind: ActionKind, resource: str, location: Any = None, then: str = READ) -> Gate: ...
    def stale(self) -> None: ...


class Shared(Protocol):
    """The batch's shared calls (``cleanup.aws.batch_calls.BatchCalls``)."""

    def deleter(self, bucket: str) -> Coalescer[Any, int]: ...


@dataclass(frozen=True)
class Context:
    """What a kind plans with: the process's runtime, the record's fence, and the batch's shared calls."""

    runtime: Host
    fence: Guard
    calls: Shared | None = None


class ActionKind(ABC):
    """One kind of resource a session holds (see the module's docstring). Made once per settings, with them."""

    name: ClassVar[str]
    api_version: ClassVar[int] = API_VERSION
    owns: ClassVar[tuple[str, ...]] = ()
    """``AttributeNames`` fields that identify this kind's resource (no other kind may own them)."""
    reads: ClassVar[tuple[str, ...]] = ()
    """``AttributeNames`` fields it only reads (they may be another kind's)."""
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
        """The gate of one step's destructive calls (``then``: the stage the thread heads to after the read)."""
        return context.fence.guard(self, resource, location, then=then)
