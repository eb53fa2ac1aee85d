"""One request for the work of many records: the live-item reads (BatchGetItem) and scratch deletions (DeleteObjects).

The records of a batch are cleaned by a few worker threads, one record at a time each, so that the code of a record
stays a straight line. Where one request can carry the work of many records, a thread hands its part to a
``Coalescer`` of that stage (reading, deleting) and waits. The parts waiting go out together, in one request sent by
one of the waiting threads, as soon as:

* the request is full (100 keys for BatchGetItem, 1,000 for DeleteObjects), or
* no thread is still on its way to this stage (``Batchmates``): each thread says where it heads next (a thread that
  got its live item heads to the deletion if its record has scratch data; one whose last page was deleted heads to
  the next record's read), so the threads of a batch, started together, go through each stage together; or
* no part has joined for ``QUIET_SECONDS``, or the first has waited ``MAX_WAIT_SECONDS``: a thread slowed down
  elsewhere (a throttled call, a slow listing) delays the others by that much at most, and then catches up with them
  at a later stage; or
* a part's deadline leaves just the time for a call (``SEND_BY_SECONDS``): no part waits for others past the moment
  its own call could still be made.

Each thread is answered for its own part only, by the sender (``Send``) that knows the request: its own result, or
the error of the request that carried it. A part that no answer names gets the request's error, or, if the sender
forgot it, an error saying so: no thread waits for ever, and no part is taken for done.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from cleanup.deadline import Deadline
from cleanup.exceptions import PermanentError

T = TypeVar("T")
R = TypeVar("R")

READ = "read"
DELETE = "delete"
COMERS = {READ: (READ, DELETE), DELETE: (DELETE,)}
"""Threads heading where may still join a stage's request: one on its way to a deletion may find nothing to delete
and come to its next read instead."""
QUIET_SECONDS = 0.1
"""How long a request waits for one more part: longer than a busy process takes to bring the next thread along
(a few records' calls of CPU, on a fraction of a vCPU), and than the spread of AWS's answers to the calls before."""
MAX_WAIT_SECONDS = 0.5
"""The longest any part waits for others, however steadily they come."""
SEND_BY_SECONDS = 1.0
"""A request goes at the latest this long before its earliest part's deadline: time for a connection and an answer
(``cleanup.aws.pacing`` starts no call with less than 0.75 s left)."""


class Batchmates:
    """The worker threads of one batch, and the stage each is heading to (None: none soon)."""

    def __init__(self, workers: int = 0, quiet: float = QUIET_SECONDS, max_wait: float = MAX_WAIT_SECONDS) -> None:
        """``workers`` threads are about to start, each heading to its first read."""
        self.quiet = quiet
        self.max_wait = max_wait
        self.lock = threading.Lock()
        self.heading: Counter[str] = Counter({READ: workers})
        self._unclaimed = workers
        self._stage: dict[int, str | None] = {}
        self._waiters: dict[str, list[threading.Condition]] = {}

    def condition(self, stage: str) -> threading.Condition:
        """A condition on ``lock`` for one coalescer of ``stage``, notified when no thread heads there any more."""
        with self.lock:
            condition = threading.Condition(self.lock)
            self._waiters.setdefault(stage, []).append(condition)
            return condition

    @contextmanager
    def worker(self) -> Iterator[None]:
        """The calling thread works for the batch while the block runs, heading first to a read."""
        me = threading.get_ident()
        with self.lock:
            if self._unclaimed:
                self._unclaimed -= 1  # counted already, when the batch began
            else:
                self.heading[READ] += 1
            self._stage[me] = READ
        try:
            yield
        finally:
            with self.lock:
                self._move(me, None)
                del self._stage[me]

    def head(self, stage: str | None) -> None:
        """The calling thread's next stage (None: it will join none soon)."""
        with self.lock:
            self._move(threading.get_ident(), stage)

    def _move(self, thread: int, stage: str | None) -> None:
        """The caller holds ``lock``."""
        if thread not in self._stage:
            return
        before = self._stage[thread]
        if before == stage:
            return
        if before is not None:
            self.heading[before] -= 1
            self._wake(before)
        if stage is not None:
            self.heading[stage] += 1
        self._stage[thread] = stage

    def expected(self, stage: str) -> int:
        """Threads that may still join a request of ``stage`` (the caller holds ``lock``)."""
        return sum(self.heading[comer] for comer in COMERS.get(stage, (stage,)))

    def _wake(self, left: str) -> None:
        """Requests waiting for the last thread that was heading to ``left`` are due once none is (the caller holds
        ``lock``)."""
        for stage, conditions in self._waiters.items():
            if left in COMERS.get(stage, (stage,)) and self.expected(stage) <= 0:
                for condition in conditions:
                    condition.notify_all()

    def _give_up_unclaimed(self) -> None:
        """Workers counted at the start that have not come yet (the pool is busy elsewhere) are not waited for."""
        if self._unclaimed:
            self.heading[READ] -= self._unclaimed
            self._unclaimed = 0
            self._wake(READ)


@dataclass(eq=False)
class Part(Generic[T, R]):
    """One thread's share of a request: what it asks, and, once answered, its result or error."""

    item: T
    size: int
    deadline: Deadline
    then: str | None = None
    thread: int = 0
    result: R | None = None
    error: BaseException | None = None
    answered: bool = False
    taken: bool = False
    at: float = 0.0
    """``time.monotonic()`` when it was answered (a read's age is counted from its answer)."""

    def answer(self, result: R) -> None:
        if not self.answered:
            self.result, self.answered, self.at = result, True, time.monotonic()

    def fail(self, error: BaseException) -> None:
        if not self.answered:
            self.error, self.answered = error, True


Send = Callable[[list[Part[T, R]], Deadline], None]
"""Sends one request for ``parts`` within the deadline and answers each part (``Part.answer`` / ``Part.fail``)."""


@dataclass(eq=False)
class _Request(Generic[T, R]):
    parts: list[Part[T, R]] = field(default_factory=list)
    size: int = 0
    opened: float = 0.0
    joined: float = 0.0
    send_by: float = math.inf
    done: threading.Event = field(default_factory=threading.Event)


class Coalescer(Generic[T, R]):
    """Parts of ``stage`` from many threads, sent together by ``send``, at most ``capacity`` (by ``Part.size``) each."""

    def __init__(
        self, mates: Batchmates, stage: str, send: Send[T, R], capacity: int, max_parts: int | None = None
    ) -> None:
        """``capacity``: a request's size (by ``Part.size``); ``max_parts``: its parts (None: no bound)."""
        self._mates = mates
        self._condition = mates.condition(stage)
        self._stage = stage
        self._send = send
        self._capacity = capacity
        self._max_parts = max_parts or math.inf
        self._pending: _Request[T, R] = _Request()

    def submit(self, item: T, size: int, deadline: Deadline, then: str | None = None) -> R:
        """Hand ``item`` in, wait for the request that carries it, and return its own answer.

        ``then`` is the stage the calling thread heads to once answered (with an error: none).

        Raises:
            Whatever error the request that carried it ended with, for this part.
        """
        return self.submit_timed(item, size, deadline, then)[0]

    def submit_timed(self, item: T, size: int, deadline: Deadline, then: str | None = None) -> tuple[R, float]:
        """``submit``, with the moment (``time.monotonic()``) its answer arrived."""
        part: Part[T, R] = Part(item, size, deadline, then, threading.get_ident())
        condition = self._condition
        with condition:
            pending = self._pending
            full = pending.parts and (pending.size + size > self._capacity or len(pending.parts) >= self._max_parts)
            earlier = self._take() if full else None  # no room for this part: what waits goes now
        if earlier is not None:
            self._dispatch(earlier)
        lead: _Request[T, R] | None = None
        with condition:
            request = self._join(part)
            while not part.taken:
                if self._due():
                    lead = self._take()
                    break
                condition.wait(self._wake_at() - time.monotonic())
        if lead is not None:
            self._dispatch(lead)
        request.done.wait()
        if part.error is not None:
            raise part.error
        return part.result, part.at  # type: ignore[return-value]  # answered without error: the sender set a result

    def _join(self, part: Part[T, R]) -> _Request[T, R]:
        now = time.monotonic()
        if not self._pending.parts:
            self._pending.opened = now
        self._pending.parts.append(part)
        self._pending.size += part.size
        self._pending.joined = now
        if part.deadline.at is not None:
            self._pending.send_by = min(self._pending.send_by, part.deadline.at - SEND_BY_SECONDS)
        self._mates._move(part.thread, None)  # waiting here, no longer on its way
        return self._pending

    def _due(self) -> bool:
        return (
            self._pending.size >= self._capacity
            or len(self._pending.parts) >= self._max_parts
            or self._mates.expected(self._stage) <= 0
            or time.monotonic() >= self._wake_at()
        )

    def _wake_at(self) -> float:
        pending = self._pending
        return min(pending.joined + self._mates.quiet, pending.opened + self._mates.max_wait, pending.send_by)

    def _take(self) -> _Request[T, R]:
        """The caller holds the batch's lock."""
        request, self._pending = self._pending, _Request()
        for part in request.parts:
            part.taken = True
        self._mates._give_up_unclaimed()
        self._condition.notify_all()  # the parts taken stop waiting to be sent
        return request

    def _dispatch(self, request: _Request[T, R]) -> None:
        """Send ``request`` on this thread, answer every part it carried, and wake them."""
        try:
            self._send(request.parts, _earliest(part.deadline for part in request.parts))
        except BaseException as exc:  # every part carried must learn the request failed, whatever the error
            for part in request.parts:
                part.fail(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            unanswered = PermanentError("internal error: a request ended without answering this part")
            with self._mates.lock:
                for part in request.parts:
                    part.fail(unanswered)
                    self._mates._move(part.thread, part.then if part.error is None else None)
            request.done.set()


def _earliest(deadlines: Iterable[Deadline]) -> Deadline:
    """The deadline no request may outlive: the earliest of its parts' (none: no deadline)."""
    ats = [deadline.at for deadline in deadlines if deadline.at is not None]
    return Deadline(min(ats)) if ats else Deadline()
