"""The one rule before every destructive call: a fresh read of the live item, positively understood, or keep.

Every call that frees a session's resource leaves only with a permit of its record's ``Fence`` (``Fence.permit``): the
DeleteConnection that closes its socket, the RetireGrant of its grant, each page of its scratch deletion (one
DeleteObjects, and the DeleteObject calls of the keys XML cannot carry), each BatchWriteItem that removes its
registry memberships, a close at CLOSE_URL, and a plugin's freeing calls. Each step reaches its freeing calls only
through the ``Gate`` the fence makes for it (``guard``), and the permit is asked where the call leaves
(``cleanup.aws.permits``: botocore's ``before-send``, after the pacer's waits for a turn and a slot; the HTTP client's
request hook), once for every attempt: a read taken before a wait never allows the call that waited. The fence knows
the action API, not the kinds: whether the live item holds a step's resource is the kind's ``holding``.

``permit`` lets the call go only on a reading of the item now stored under the deleted session's key in
SESSION_TABLE (a consistent read, shared with the other records of the batch in one BatchGetItem) that was taken

* after this record's previous destructive call (for the first one: after the record's processing began), and
* after this record's last failure or retry: time has passed, and a reading from before it may be old;

whose answer arrived at most FENCE_READ_MAX_AGE_SECONDS before the call is sent (an older reading is read again), and
that was positively understood to say the resource is not held:

* **Fail closed.** A read that cannot be understood (an answer without the table under ``Responses``, keys still
  unprocessed at the deadline, an unparseable body, an item whose session attributes cannot be read) raises: the
  resource is kept and the record is reported.
* **Held means keep.** A live item that holds the resource (same connection, same grant, scratch data whose
  location overlaps) keeps it; one whose scratch prefix names no S3 location that can be compared keeps it too, and
  fails the step permanently for a person to look at.
* **Live again means stop.** A reading that differs from the record's first reading (the session was re-created, or
  changed its resources, while it was being cleaned) stops every remaining step of the record: what is left is kept,
  and the record is reported (transient), so that its next delivery decides afresh against the item as it is then.

One reading may allow several destructive calls issued together, never two that follow one another: a record's
destructive call with the first calls of the steps it ``launch``es at that moment (the pipeline frees the grant
beside the socket, on one read: ``on_next_permit`` and ``allow_once``), as long as it is still younger than the bound
when they are sent. A DeleteObjects carrying several records' pages reads their items together, in one BatchGetItem,
when it is sent (``permit_on``). A reading that allowed nothing (its resource was held) is still fresh for the next
step, within the same bound. With RACE_CHECK=false (an operator's explicit choice, for a table where a key is never
reused) nothing is read and every call is allowed.

Every reading and every permit is logged at DEBUG (``fence read`` with the reading's number, ``fence permit`` with
the number of the reading that allowed the call), so that a run can be checked against the rule.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cleanup.aws.coalesce import READ
from cleanup.aws.permits import Permit
from cleanup.core.action_api import ActionKind, Gate, Holding, Sender
from cleanup.deadline import Deadline
from cleanup.exceptions import CleanupError, NowHeldError, PermanentError
from cleanup.telemetry import log
from schemas.session import Session

__all__ = [
    "Fence",
    "Launch",
    "LiveRead",
    "PartsRefused",
    "Reader",
    "Reading",
    "incomparable_prefix",
    "permits_together",
]

Reader = Callable[[Deadline, str | None], tuple[Session | None, float]]
"""Reads the item now stored under the deleted session's key (``then``: the stage the thread heads to next): the item,
or None, and ``time.monotonic()`` when the answer arrived."""


ReadMany = Callable[[str, list[dict[str, Any]], Deadline], list[tuple[Session | None, float] | BaseException]]
"""Reads the items under several keys of a table at once: each one's answer (as ``Reader``'s) or error. Fences whose
``many`` is the same (equal: one batch's bound method) are read together."""


@dataclass(frozen=True)
class LiveRead:
    """Where a fence reads: the item under ``keys`` in ``table``, through ``read`` (a ``Reader``); given so, the
    fences of several records can be read in one request (``many``: a DeleteObjects carrying their pages)."""

    table: str
    keys: dict[str, Any]
    read: Reader
    many: ReadMany

    def __call__(self, deadline: Deadline, then: str | None) -> tuple[Session | None, float]:
        return self.read(deadline, then)


@dataclass(frozen=True)
class Reading:
    """What a read found under the key: the live session, or None when there is no item; ``number``: the record's
    how-many-th read it was; ``at``: when its answer arrived (None: nothing was read, RACE_CHECK=false)."""

    live: Session | None
    number: int = 0
    at: float | None = None

    def fresh(self, max_age: float) -> bool:
        return self.at is None or time.monotonic() - self.at <= max_age


Launch = Callable[[Reading], None]
"""Starts the calls to be issued together with the one a reading is about to allow."""


class Fence:
    """One record's gate in front of its destructive calls (see the module's docstring for the rule)."""

    def __init__(self, read: Reader | None, max_age: float = 0.25) -> None:
        """``read``: the live item's reader, None when the race check is turned off; ``max_age``:
        FENCE_READ_MAX_AGE_SECONDS."""
        self._read = read
        self.max_age = max_age
        self._lock = threading.RLock()  # a record's steps issued together ask from several threads
        self._fresh: Reading | None = None
        self._first: Reading | None = None
        self._readings = 0
        self._launch: Launch | None = None
        self._once: dict[str, Reading] = {}
        self._gates: dict[tuple[str, str], list[Gate]] = {}
        self.stopped: str | None = None
        """Why the record's remaining steps were stopped (a reading differed from the first), or None."""

    @property
    def source(self) -> LiveRead | None:
        """Where this fence reads, when it can be read together with others' (None: it reads alone, or not at all)."""
        return self._read if isinstance(self._read, LiveRead) else None

    def guard(
        self, kind: ActionKind, resource: str, location: Any = None, then: str = READ, *, sender: Sender | None = None
    ) -> Gate:
        """The gate of one step's freeing calls, whose permits cover what ``kind.covering`` names
        (``cleanup.aws.permits``). ``then``: where the thread heads once the read is answered (the next stage it shares
        with the batch: a deletion, or its next read); ``sender``: how ``Gate.aws`` sends."""
        covers, prefixes = kind.covering(resource, location)
        covered, under = frozenset(covers), tuple(prefixes)

        def ask(deadline: Deadline, reading: Reading | None) -> Permit:
            with self._lock:
                once = self._once.pop(kind.name, None)
            if reading is not None:  # read together with other records' (``permits_together``)
                self._take(reading)
                self._allow(kind, resource, location, reading)
                log.debug("fence permit", extra={"fenceReading": reading.number, "action": kind.name})
            elif once is not None and once.fresh(self.max_age):  # issued together with the call that took it
                self._allow(kind, resource, location, once)
                reading = once
            else:
                reading = self.permit(kind, resource, location, deadline, then)
            return Permit(kind.name, covered, under, reading.at, reading.number)

        gate = Gate(ask, kind.name, sender, self.max_age)
        gate.fence = self
        with self._lock:
            self._gates.setdefault((kind.name, resource), []).append(gate)
        return gate

    def gates(self, action: str, resource: str) -> list[Gate]:
        """The gates made for ``action``'s step on ``resource`` (what they gave and refused judge the step)."""
        with self._lock:
            return list(self._gates.get((action, resource), ()))

    def on_next_permit(self, launch: Launch | None) -> None:
        """Call ``launch`` with the reading that allows the next destructive call, right before it is made: what it
        starts is issued together with that call (None: nothing)."""
        with self._lock:
            self._launch = launch

    def allow_once(self, action: str, reading: Reading) -> None:
        """Let the next call of ``action``'s step go on ``reading`` (one taken for calls issued together), if it
        holds nothing of that step and is still fresh when that call is sent; its calls after that read again."""
        with self._lock:
            self._once[action] = reading
        log.debug("fence permit", extra={"fenceReading": reading.number, "action": action, "together": True})

    def permit(self, kind: ActionKind, resource: str, location: Any, deadline: Deadline, then: str | None) -> Reading:
        """The reading that lets one destructive call on ``resource`` go now; raise to keep it.

        Raises:
            NowHeldError: the live item holds the resource, or the record was stopped (``stopped``).
            PermanentError: the kind cannot tell whether the live item holds the resource (``ActionKind.unknown``).
            TransientError / PermanentError: the read failed, or its answer could not be understood.
        """
        if self._read is None:
            return Reading(None)
        with self._lock:
            if self.stopped is not None:
                raise NowHeldError(f"not attempted: {self.stopped}")
            self.reading(deadline, then)
            reading = self._fresh
            assert reading is not None
            self._allow(kind, resource, location, reading)
            log.debug("fence permit", extra={"fenceReading": reading.number, "action": kind.name})
            self._fresh = None  # the call it allows is now the record's latest destructive call
            launch, self._launch = self._launch, None
        if launch is not None:
            launch(reading)
        return reading

    def needs_read(self) -> bool:
        """Whether the next permit would read (no fresh reading is at hand), for a request reading several fences."""
        with self._lock:
            return self._read is not None and not (self._fresh is not None and self._fresh.fresh(self.max_age))

    def read_for(self, live: Session | None, at: float) -> Reading:
        """A reading taken for this fence elsewhere (one request for several fences), numbered as its own."""
        with self._lock:
            self._readings += 1
            return Reading(live, self._readings, at)

    def _take(self, reading: Reading) -> None:
        """Make ``reading`` (read for this fence with others') the fresh one, and judge it against the first."""
        with self._lock:
            if self.stopped is not None:
                raise NowHeldError(f"not attempted: {self.stopped}")
            self._fresh = reading
            self._compare()
            log.debug("fence read", extra={"fenceReading": reading.number})
            self._fresh = None

    def _allow(self, kind: ActionKind, resource: str, location: Any, reading: Reading) -> None:
        if self.stopped is not None:
            raise NowHeldError(f"not attempted: {self.stopped}")
        if reading.live is None:
            return
        held = kind.holding(resource, reading.live, location)
        if held is Holding.HELD:
            raise NowHeldError(f"the live session under the same key holds this {kind.name}: kept")
        if held is Holding.UNKNOWN:
            raise kind.unknown(resource, reading.live)

    def verdict(self, kind: ActionKind, resource: str, location: Any, deadline: Deadline) -> Holding:
        """Whether the live item holds ``resource`` (a dry run's plan: reads once, allows nothing)."""
        if self._read is None:
            return Holding.FREE
        with self._lock:
            live = self.reading(deadline, READ)
        if live is None:
            return Holding.FREE
        return kind.holding(resource, live, location)

    def reading(self, deadline: Deadline, then: str | None) -> Session | None:
        """The fresh reading, read now if there is none younger than the bound; compared with the record's first."""
        assert self._read is not None
        with self._lock:
            if self._fresh is None or not self._fresh.fresh(self.max_age):
                live, at = self._read(deadline, then)
                self._readings += 1
                self._fresh = Reading(live, self._readings, at)
                log.debug("fence read", extra={"fenceReading": self._readings})
            self._compare()
            return self._fresh.live

    def _compare(self) -> None:
        """The caller holds the lock, with a fresh reading: a reading unlike the record's first stops it."""
        assert self._fresh is not None
        if self._first is None:
            self._first = self._fresh
        elif self._fresh.live != self._first.live and self.stopped is None:
            self.stopped = (
                "the session was re-created under the same key (or changed its resources) while it was being "
                "cleaned: the rest is kept, and the record is tried again against the item as it is now"
            )

    def live(self) -> Session | None:
        """The latest reading's live item (for messages)."""
        reading = self._fresh or self._first
        return reading.live if reading is not None else None

    def live_prefix(self) -> str | None:
        """The scratch prefix of the latest reading's live item (for messages)."""
        live = self.live()
        return live.scratch_prefix if live is not None else None

    def stale(self) -> None:
        """After a failure or before a retry: the next destructive call reads again."""
        with self._lock:
            self._fresh = None
            self._once.clear()  # a step launched beside another reads for itself too


class PartsRefused(CleanupError):
    """Some of the records a request carries keep their part (``errors``, by ``id`` of the part): nothing was sent,
    and the request goes again without them."""

    def __init__(self, errors: dict[int, BaseException]) -> None:
        super().__init__(f"{len(errors)} parts kept at the send")
        self.errors = errors


def permits_together(gates: list[Gate], deadline: Deadline) -> list[Permit | BaseException]:
    """Each gate's permit, asked now, the fences that need a fresh read read together (one BatchGetItem per table):
    a permit, or the error that keeps its resource."""
    results: list[Permit | BaseException | None] = [None] * len(gates)
    together: dict[tuple[str, ReadMany], list[int]] = {}
    for index, gate in enumerate(gates):
        fence = gate.fence
        source = fence.source if isinstance(fence, Fence) else None
        if source is not None and fence.needs_read():
            together.setdefault((source.table, source.many), []).append(index)
            continue
        try:
            results[index] = gate.authorize(deadline)
        except (CleanupError, NowHeldError) as exc:
            results[index] = exc
    for indexes in together.values():
        fences = [gates[index].fence for index in indexes]
        table, many = fences[0].source.table, fences[0].source.many
        answers = many(table, [fence.source.keys for fence in fences], deadline)
        for index, fence, answer in zip(indexes, fences, answers, strict=True):
            try:
                if isinstance(answer, BaseException):
                    gates[index].refuse(answer)
                    raise answer
                results[index] = gates[index].authorize_on(fence.read_for(*answer), deadline)
            except (CleanupError, NowHeldError) as exc:
                results[index] = exc
    return [result if result is not None else PermanentError("internal error: no permit asked") for result in results]


def incomparable_prefix(old_prefix: str, live_prefix: str | None) -> PermanentError:
    return PermanentError(
        f"the live session under the same key has scratch prefix {live_prefix!r}, which names no S3 location that "
        f"can be compared with {old_prefix!r}: both are kept; check the live item, then redrive this record"
    )
