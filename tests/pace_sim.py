"""A service answering paced requests on a fake clock: a token-bucket quota or random throttling, for ``test_rate``.

``workers`` callers each send one request at a time, at the turns a ``Rate`` gives (a turn given before a cut is
reserved again, as ``pacing`` does), answered after ``latency`` seconds (a throttling answer sooner). Everything runs
on a clock of its own, in order of events: the same seed gives the same answers, however loaded the machine.
``drain`` is the backlog's drain instead: environments taking a batch of messages at a time and reserving its calls'
turns at once.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from cleanup.aws.rate import Rate

THROTTLE_LATENCY = 0.005  # a throttling answer comes back sooner than an accepted one


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Tally:
    """Requests sent and answers, from a point in time on."""

    since: float
    sent: int = 0
    admitted: int = 0
    throttled: int = 0
    limits: list[float | None] = field(default_factory=list)


@dataclass
class Service:
    """Throttles beyond ``quota`` requests a second (a bucket holding a second's worth), or ``random_share`` of all."""

    quota: float | None = None
    random_share: float = 0.0
    seed: int = 1

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        self._tokens = self.quota or 0.0
        self._counted = 0.0

    def throttles(self, now: float) -> bool:
        if self.quota is not None:
            self._tokens = min(self.quota, self._tokens + (now - self._counted) * self.quota)
            self._counted = now
            if self._tokens < 1.0:
                return True
            self._tokens -= 1.0
        return self._random.random() < self.random_share


def drive(
    service: Service,
    seconds: float,
    *,
    workers: int = 16,
    latency: float = 0.02,
    since: float = 0.0,
    learners: int = 1,
) -> Tally:
    """Run ``workers`` callers against ``service`` for ``seconds``; what happened from ``since`` on. With several
    ``learners``, the callers are shared out among as many ``Rate`` (processes of their own on one quota)."""
    clock = Clock()
    rates = [Rate("kms", clock=clock) for _ in range(learners)]
    tally = Tally(since)
    events: list[tuple[float, int, int, str, float]] = [(0.0, n, n, "turn", 0.0) for n in range(workers)]
    order = workers
    in_flight = 0
    while events:
        clock.now, _, worker, kind, stamp = heapq.heappop(events)
        if clock.now > seconds:
            break
        order += 1
        rate = rates[worker % learners]
        counted = clock.now >= since
        if kind == "turn":  # reserve a turn
            heapq.heappush(events, (rate.reserve(clock.now + 60.0) or clock.now, order, worker, "send", clock.now))
        elif kind == "send" and not rate.current(stamp):  # the turn was given before a cut
            heapq.heappush(events, (clock.now, order, worker, "turn", 0.0))
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
            tally.admitted += counted and kind == "admitted"
            tally.throttled += counted and kind == "throttled"
            tally.limits.append(rate.limit)
            heapq.heappush(events, (clock.now, order, worker, "turn", 0.0))
    return tally


def drain(
    service: Service,
    seconds: float,
    *,
    learners: int,
    start: float,
    batch: int = 10,
    latency: tuple[float, float] = (0.08, 0.25),
    overhead: float = 0.25,
    backoff: float = 0.4,
    since: float = 0.0,
    draw: int = 0,
) -> Tally:
    """The backlog's drain: ``learners`` environments (a ``Rate`` each, started at ``start`` / ``learners``, the
    sender's rate shared out) take ``batch`` messages at a time from a queue with no end, and reserve the turns of a
    batch's calls at once (a thread each); a throttled call is tried again after about ``backoff`` seconds, the next
    batch taken ``overhead`` seconds after the last of a batch is answered. Answers take a time drawn in ``latency``
    (seeded by ``draw``); what happened from ``since`` on, with ``limits`` the learners' limits at the end."""
    run = _Drain(service, learners, start, batch, latency, overhead, backoff, since, draw)
    while run.events:
        run.clock.now, _, kind, learner, stamp = heapq.heappop(run.events)
        if run.clock.now > seconds:
            break
        run.step(kind, learner, stamp)
    run.tally.limits = [rate.limit for rate in run.rates]
    return run.tally


class _Drain:
    """The state of one ``drain`` run, and what each event does to it."""

    def __init__(
        self,
        service: Service,
        learners: int,
        start: float,
        batch: int,
        latency: tuple[float, float],
        overhead: float,
        backoff: float,
        since: float,
        draw: int,
    ) -> None:
        self.service, self.batch, self.latency, self.overhead, self.backoff = service, batch, latency, overhead, backoff
        self.random = random.Random(draw)
        self.clock = Clock()
        self.rates = [Rate("kms", clock=self.clock) for _ in range(learners)]
        for rate in self.rates:
            rate.seed(start / learners)
        self.tally = Tally(since)
        self.events: list[tuple[float, int, str, int, float]] = []
        self.order = 0
        self.pending = [0] * learners  # calls of the batch not yet admitted
        self.in_flight = [0] * learners
        for learner in range(learners):
            self.push(self.random.uniform(0.0, 0.5), "batch", learner)

    def push(self, when: float, kind: str, learner: int, stamp: float = 0.0) -> None:
        self.order += 1
        heapq.heappush(self.events, (when, self.order, kind, learner, stamp))

    def step(self, kind: str, learner: int, stamp: float) -> None:
        now, rate = self.clock.now, self.rates[learner]
        if kind == "batch":  # a thread per message, each reserving its call's turn at once
            self.pending[learner] = self.batch
            for _ in range(self.batch):
                self.push(now, "turn", learner)
        elif kind == "turn":
            self.push(rate.reserve(now + 60.0) or now, "send", learner, now)
        elif kind == "send" and not rate.current(stamp):  # the turn was given before a cut
            self.push(now, "turn", learner)
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
        counted = now >= self.tally.since
        self.tally.admitted += counted and not throttled
        self.tally.throttled += counted and throttled
        if throttled:  # tried again after a backoff
            self.push(now + self.backoff * self.random.uniform(0.5, 1.5), "turn", learner)
            return
        self.pending[learner] -= 1
        if not self.pending[learner]:  # the batch is done: the next one
            self.push(now + self.overhead, "batch", learner)
