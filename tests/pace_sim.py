"""A service answering paced requests on a fake clock: a token-bucket quota or random throttling, for ``test_rate``.

``workers`` callers each send one request at a time, at the turns a ``Rate`` gives (a turn given before a cut is
reserved again, as ``pacing`` does), answered after ``latency`` seconds (a throttling answer sooner). Everything runs
on a clock of its own, in order of events: the same seed gives the same answers, however loaded the machine.
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
