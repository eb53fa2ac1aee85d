"""A service answering paced requests on a fake clock: a token-bucket quota or random throttling, for ``test_rate``.

``workers`` callers each send one request at a time, at the turns a ``Rate`` gives (a caller waiting for a turn
given before the limit changed is woken and reserves again, as ``pacing`` does), answered after ``latency`` seconds
(a throttling answer sooner). Everything runs on a clock of its own, in order of events: the same seed gives the same
answers, however loaded the machine.
``drain`` is the backlog's drain instead: environments taking a batch of messages at a time and reserving its calls'
turns at once. Both take the pacing ``law`` as a factory (the worker's ``Rate`` by default; ``Unpaced`` sends at every
turn), so that the pacing benchmark (``benchmarks.pacing``) runs laws side by side on the same draws.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from cleanup.aws.rate import Rate

THROTTLE_LATENCY = 0.005  # a throttling answer comes back sooner than an accepted one
TURN_WAIT = 60.0  # a caller waits this long for a turn at most; with none by then, the pacer sends nothing
NO_TURN_RETRY = 1.0  # and a caller asks again this much later


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


class Law(Protocol):
    """What the simulation asks of a pacing law: ``Rate``'s interface."""

    @property
    def limit(self) -> float | None: ...

    def reserve(self, latest: float) -> float | None: ...

    def seed(self, limit: float) -> bool: ...

    def current(self, reserved: float) -> bool: ...

    def answered(self, sent: float, *, throttled: bool, outstanding: int = 0) -> float | None: ...


LawFactory = Callable[[Callable[[], float]], Law]
"""A new law on the given clock."""


def learnt(clock: Callable[[], float]) -> Law:
    """The worker's own law: ``cleanup.aws.rate.Rate``."""
    return Rate("kms", clock=clock)


class Unpaced:
    """No pacing: every turn at once, nothing learnt (what the throttling alone lets through)."""

    limit = None

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock

    def reserve(self, latest: float) -> float | None:
        return self._clock()

    def seed(self, limit: float) -> bool:
        return False

    def current(self, reserved: float) -> bool:
        return True

    def answered(self, sent: float, *, throttled: bool, outstanding: int = 0) -> float | None:
        return None


@dataclass
class Tally:
    """Requests sent and answers, from a point in time on; ``answers``: (when, throttled) of each answer counted."""

    since: float
    sent: int = 0
    admitted: int = 0
    throttled: int = 0
    limits: list[float | None] = field(default_factory=list)
    answers: list[tuple[float, bool]] = field(default_factory=list)


@dataclass
class Service:
    """Throttles beyond ``quota`` requests a second (a bucket holding a second's worth, and one request at least:
    else a quota under one a second would let none through), or ``random_share`` of all
    from ``noise_since`` on; ``changes``: (when, quota) the quota is set to from then on, in order of time."""

    quota: float | None = None
    random_share: float = 0.0
    seed: int = 1
    changes: tuple[tuple[float, float], ...] = ()
    noise_since: float = 0.0

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        self._tokens = self.quota or 0.0
        self._counted = 0.0
        self._changes = list(self.changes)

    def throttles(self, now: float) -> bool:
        while self._changes and self._changes[0][0] <= now:
            _, self.quota = self._changes.pop(0)
            self._tokens = min(self._tokens, self.quota)
        if self.quota is not None:
            self._tokens = min(max(self.quota, 1.0), self._tokens + (now - self._counted) * self.quota)
            self._counted = now
            if self._tokens < 1.0:
                return True
            self._tokens -= 1.0
        return now >= self.noise_since and self._random.random() < self.random_share


def drive(
    service: Service,
    seconds: float,
    *,
    workers: int = 16,
    latency: float = 0.02,
    since: float = 0.0,
    learners: int = 1,
    law: LawFactory = learnt,
) -> Tally:
    """Run ``workers`` callers against ``service`` for ``seconds``; what happened from ``since`` on. With several
    ``learners``, the callers are shared out among as many laws (processes of their own on one quota)."""
    clock = Clock()
    rates = [law(clock) for _ in range(learners)]
    tally = Tally(since)
    events: list[tuple[float, int, int, str, float]] = [(0.0, n, n, "turn", 0.0) for n in range(workers)]
    order = workers
    in_flight = 0
    waiting = [_Waiting() for _ in range(learners)]
    while events:
        clock.now, seq, worker, kind, stamp = heapq.heappop(events)
        if clock.now > seconds:
            break
        if kind == "send" and not waiting[worker % learners].come(seq):
            continue  # woken before: its turn was given again
        order += 1
        rate = rates[worker % learners]
        counted = clock.now >= since
        if kind == "turn":  # reserve a turn; none within TURN_WAIT: not sent, asked again later (as the pacer does)
            turn = rate.reserve(clock.now + TURN_WAIT)
            if turn is None:
                heapq.heappush(events, (clock.now + NO_TURN_RETRY, order, worker, "turn", 0.0))
            else:
                heapq.heappush(events, (turn, order, worker, "send", clock.now))
                waiting[worker % learners].add(order, worker, clock.now)
        elif kind == "send":
            throttled = service.throttles(clock.now)
            in_flight += 1
            tally.sent += counted
            answer = "throttled" if throttled else "admitted"
            delay = THROTTLE_LATENCY if throttled else latency
            heapq.heappush(events, (clock.now + delay, order, worker, answer, clock.now))
        else:
            in_flight -= 1
            rate.answered(stamp, throttled=kind == "throttled", outstanding=in_flight)
            for other in waiting[worker % learners].woken(rate):
                order += 1
                heapq.heappush(events, (clock.now, order, other, "turn", 0.0))
            tally.admitted += counted and kind == "admitted"
            tally.throttled += counted and kind == "throttled"
            if counted:
                tally.answers.append((clock.now, kind == "throttled"))
            tally.limits.append(rate.limit)
            heapq.heappush(events, (clock.now, order, worker, "turn", 0.0))
    return tally


class _Waiting:
    """The send events still to come of one law's callers, by order: whose each is, and when its turn was given (in
    the order given). A caller whose turn the law no longer holds is woken and reserves again, as ``Rate.wait`` does."""

    def __init__(self) -> None:
        self._sends: dict[int, tuple[int, float]] = {}

    def add(self, event: int, caller: int, given: float) -> None:
        self._sends[event] = (caller, given)

    def come(self, event: int) -> bool:
        """Whether the send ``event`` still stands (taken out): else its caller was woken before it came."""
        return self._sends.pop(event, None) is not None

    def woken(self, law: Law) -> list[int]:
        """The callers whose turn ``law`` no longer holds, taken out. A turn holds if given since the law last gave
        turns again, so the oldest ones are the ones to wake."""
        stale = list(itertools.takewhile(lambda event: not law.current(self._sends[event][1]), self._sends))
        return [self._sends.pop(event)[0] for event in stale]


def drain(
    service: Service,
    seconds: float,
    *,
    learners: int,
    start: float | None,
    batch: int | tuple[int, int] = 10,
    latency: tuple[float, float] = (0.08, 0.25),
    overhead: float = 0.25,
    backoff: float = 0.4,
    since: float = 0.0,
    draw: int = 0,
    law: LawFactory = learnt,
) -> Tally:
    """The backlog's drain: ``learners`` environments (a law each, started at ``start`` / ``learners``, the sender's
    rate shared out; unseeded when None) take ``batch`` messages at a time (a size drawn in that range, when a pair)
    from a queue with no end, and reserve the turns of a batch's calls at once (a thread each); a throttled call is
    tried again after about ``backoff`` seconds, the next batch taken ``overhead`` seconds after the last of a batch
    is answered. Answers take a time drawn in ``latency`` (seeded by ``draw``); what happened from ``since`` on, with
    ``limits`` the learners' limits at the end."""
    run = _Drain(service, learners, start, batch, latency, overhead, backoff, since, draw, law)
    while run.events:
        run.clock.now, seq, kind, learner, stamp = heapq.heappop(run.events)
        if run.clock.now > seconds:
            break
        if kind == "send" and not run.waiting[learner].come(seq):
            continue  # woken before: its turn was given again
        run.step(kind, learner, stamp)
    run.tally.limits = [rate.limit for rate in run.rates]
    return run.tally


class _Drain:
    """The state of one ``drain`` run, and what each event does to it."""

    def __init__(
        self,
        service: Service,
        learners: int,
        start: float | None,
        batch: int | tuple[int, int],
        latency: tuple[float, float],
        overhead: float,
        backoff: float,
        since: float,
        draw: int,
        law: LawFactory,
    ) -> None:
        self.service, self.batch, self.latency, self.overhead, self.backoff = service, batch, latency, overhead, backoff
        self.random = random.Random(draw)
        self.clock = Clock()
        self.rates = [law(self.clock) for _ in range(learners)]
        for rate in self.rates:
            if start is not None:
                rate.seed(start / learners)
        self.tally = Tally(since)
        self.events: list[tuple[float, int, str, int, float]] = []
        self.order = 0
        self.pending = [0] * learners  # calls of the batch not yet admitted
        self.in_flight = [0] * learners
        self.waiting = [_Waiting() for _ in range(learners)]
        for learner in range(learners):
            self.push(self.random.uniform(0.0, 0.5), "batch", learner)

    def push(self, when: float, kind: str, learner: int, stamp: float = 0.0) -> None:
        self.order += 1
        heapq.heappush(self.events, (when, self.order, kind, learner, stamp))

    def step(self, kind: str, learner: int, stamp: float) -> None:
        now, rate = self.clock.now, self.rates[learner]
        if kind == "batch":  # a thread per message, each reserving its call's turn at once
            size = self.batch if isinstance(self.batch, int) else self.random.randint(*self.batch)
            self.pending[learner] = size
            for _ in range(size):
                self.push(now, "turn", learner)
        elif kind == "turn":
            turn = rate.reserve(now + TURN_WAIT)
            if turn is None:  # no turn in time: not sent, tried again after a backoff
                self.push(now + self.backoff * self.random.uniform(0.5, 1.5), "turn", learner)
            else:
                self.push(turn, "send", learner, now)
                self.waiting[learner].add(self.order, learner, now)
        elif kind == "send":
            throttled = self.service.throttles(now)
            self.in_flight[learner] += 1
            self.tally.sent += now >= self.tally.since
            delay = THROTTLE_LATENCY if throttled else self.random.uniform(*self.latency)
            self.push(now + delay, "throttled" if throttled else "admitted", learner, now)
        else:
            self.answered(learner, stamp, throttled=kind == "throttled")

    def answered(self, learner: int, stamp: float, *, throttled: bool) -> None:
        now = self.clock.now
        self.in_flight[learner] -= 1
        self.rates[learner].answered(stamp, throttled=throttled, outstanding=self.in_flight[learner])
        for _ in self.waiting[learner].woken(self.rates[learner]):
            self.push(now, "turn", learner)
        counted = now >= self.tally.since
        self.tally.admitted += counted and not throttled
        self.tally.throttled += counted and throttled
        if counted:
            self.tally.answers.append((now, throttled))
        if throttled:  # tried again after a backoff
            self.push(now + self.backoff * self.random.uniform(0.5, 1.5), "turn", learner)
            return
        self.pending[learner] -= 1
        if not self.pending[learner]:  # the batch is done: the next one
            self.push(now + self.overhead, "batch", learner)
