"""The one rule before every destructive call: a fresh read of the live item, positively understood, or keep.

Every call that frees a session's resource goes through its record's ``Fence`` first (``Fence.permit``): the
DeleteConnection that closes its socket, the RetireGrant of its grant, each page of its scratch deletion (one
DeleteObjects, and the DeleteObject calls of the keys XML cannot carry), and each BatchWriteItem that removes its
registry memberships. Each step reaches its destructive calls only through the ``Gate`` the fence makes for it
(``guard``), which asks the permit inside the call (``cleanup.actions.api``): a kind cannot make one without it. The
fence knows the action API, not the kinds: whether the live item holds a step's resource is the kind's
``holding``.

``permit`` lets the call go only on a reading of the item now stored under the deleted session's key in
SESSION_TABLE (a consistent read, shared with the other records of the batch in one BatchGetItem) that was taken

* after this record's previous destructive call (for the first one: after the record's processing began), and
* after this record's last failure or retry: time has passed, and a reading from before it may be old;

and that was positively understood to say the resource is not held:

* **Fail closed.** A read that cannot be understood (an answer without the table under ``Responses``, keys still
  unprocessed at the deadline, an unparseable body, an item whose session attributes cannot be read) raises: the
  resource is kept and the record is reported.
* **Held means keep.** A live item that holds the resource (same connection, same grant, scratch data whose
  location overlaps) keeps it; one whose scratch prefix names no S3 location that can be compared keeps it too, and
  fails the step permanently for a person to look at.
* **Live again means stop.** A reading that differs from the record's first reading (the session was re-created, or
  changed its resources, while it was being cleaned) stops every remaining step of the record: what is left is kept,
  and the record is reported (transient), so that its next delivery decides afresh against the item as it is then.

One reading may allow several destructive calls issued together, never two that follow one another: a page's
DeleteObjects and its DeleteObject calls; and a record's destructive call with the first calls of the steps it
``launch``es at that moment (the pipeline frees the grant beside the socket, on one read: ``on_next_permit`` and
``allow_once``). A reading that allowed nothing (its resource was held) is still fresh for the next step. With
RACE_CHECK=false (an operator's explicit choice, for a table where a key is never reused) nothing is read and every
call is allowed.

Every reading and every permit is logged at DEBUG (``fence read`` with the reading's number, ``fence permit`` with
the number of the reading that allowed the call), so that a run can be checked against the rule.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cleanup.actions.api import ActionKind, Gate, Holding, Permit
from cleanup.aws.coalesce import READ
from cleanup.aws.retry import Deadline
from cleanup.exceptions import NowHeldError, PermanentError
from cleanup.telemetry import log
from schemas.session import Session

__all__ = ["Fence", "Launch", "Permit", "Reader", "Reading", "incomparable_prefix"]

Reader = Callable[[Deadline, str | None], Session | None]
"""Reads the item now stored under the deleted session's key (``then``: the stage the thread heads to next)."""


@dataclass(frozen=True)
class Reading:
    """What a read found under the key: the live session, or None when there is no item; ``number``: the record's
    how-many-th read it was."""

    live: Session | None
    number: int = 0


Launch = Callable[[Reading], None]
"""Starts the calls to be issued together with the one a reading is about to allow."""


class Fence:
    """One record's gate in front of its destructive calls (see the module's docstring for the rule)."""

    def __init__(self, read: Reader | None) -> None:
        """``read``: the live item's reader, None when the race check is turned off."""
        self._read = read
        self._lock = threading.RLock()  # a record's steps issued together ask from several threads
        self._fresh: Reading | None = None
        self._first: Reading | None = None
        self._readings = 0
        self._launch: Launch | None = None
        self._once: dict[str, Reading] = {}
        self.stopped: str | None = None
        """Why the record's remaining steps were stopped (a reading differed from the first), or None."""

    def guard(self, kind: ActionKind, resource: str, location: Any = None, then: str = READ) -> Gate:
        """The gate of one step's destructive calls, which asks the permit inside each call. ``then``: where the
        thread heads once the read is answered (the next stage it shares with the batch: a deletion, or its next
        read)."""

        def permit(deadline: Deadline) -> None:
            with self._lock:
                once = self._once.pop(kind.name, None)
            if once is not None:  # issued together with the call that took this reading
                self._allow(kind, resource, location, once)
                return
            self.permit(kind, resource, location, deadline, then)

        return Gate(permit)

    def on_next_permit(self, launch: Launch | None) -> None:
        """Call ``launch`` with the reading that allows the next destructive call, right before it is made: what it
        starts is issued together with that call (None: nothing)."""
        with self._lock:
            self._launch = launch

    def allow_once(self, action: str, reading: Reading) -> None:
        """Let the next call of ``action``'s step go on ``reading`` (one taken for calls issued together), if it
        holds nothing of that step; its calls after that read again."""
        with self._lock:
            self._once[action] = reading
        log.debug("fence permit", extra={"fenceReading": reading.number, "action": action, "together": True})

    def permit(self, kind: ActionKind, resource: str, location: Any, deadline: Deadline, then: str | None) -> None:
        """Return to let one destructive call on ``resource`` go; raise to keep it.

        Raises:
            NowHeldError: the live item holds the resource, or the record was stopped (``stopped``).
            PermanentError: the kind cannot tell whether the live item holds the resource (``ActionKind.unknown``).
            TransientError / PermanentError: the read failed, or its answer could not be understood.
        """
        if self._read is None:
            return
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
        """The fresh reading, read now if there is none; compared with the record's first."""
        assert self._read is not None
        with self._lock:
            if self._fresh is None:
                live = self._read(deadline, then)
                self._readings += 1
                self._fresh = Reading(live, self._readings)
                log.debug("fence read", extra={"fenceReading": self._readings})
            if self._first is None:
                self._first = self._fresh
            elif self._fresh.live != self._first.live and self.stopped is None:
                self.stopped = (
                    "the session was re-created under the same key (or changed its resources) while it was being "
                    "cleaned: the rest is kept, and the record is tried again against the item as it is now"
                )
            return self._fresh.live

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


def incomparable_prefix(old_prefix: str, live_prefix: str | None) -> PermanentError:
    return PermanentError(
        f"the live session under the same key has scratch prefix {live_prefix!r}, which names no S3 location that "
        f"can be compared with {old_prefix!r}: both are kept; check the live item, then redrive this record"
    )
