"""The rate a throttling service accepts, learnt from its answers, and requests spaced to it (``pacing.Gate.rate``).

AWS request quotas are token buckets: so many requests a second, with a burst on top. A client sending faster gets
a share of its requests throttled that grows with its rate: ``(sent - quota) / sent``. A service overloaded for a
moment throttles a small share whatever the rate. ``Rate`` tells the two apart by that share:

* Unlimited until, over the last second (at least MIN_ANSWERS answers), ENGAGE_SHARE or more of the answers were
  throttled. The limit is then set just under what the service accepted over that second, the requests still
  unanswered counted in (a throttling answer comes back faster than an accepted one, so at the first throttling the
  requests it let through may not have answered yet). The same happens again, at most once a second, while the
  share stays that high.
* Scattered throttling (a lower share) cuts nothing: lowering the rate would not lower it, and a rate cut on every
  such answer would soon reach nothing at all.
* Each second the limit grows by GROWTH, so that a raised quota is found again; grown far past anything asked, it is
  dropped.

Requests are spaced to the limit (``reserve``), shared by every thread of the process; a request whose turn would
come after its caller's deadline is not given one. botocore's own adaptive retry mode does much the same, but its
token bucket waits for a token with no deadline, it belongs to one client (the Management API has one per endpoint),
and it cuts the rate at every throttling answer, so that scattered throttling drives it towards nothing.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque


class Rate:
    """Requests per second a service accepts, learnt from its answers; ``limit`` None: no limit known."""

    WINDOW_SECONDS = 1.0  # quotas are counted per second
    MIN_ANSWERS = 20  # fewer answers than this in a window say too little about a share
    ENGAGE_SHARE = 0.2  # a throttled share this high says the requests are over a quota
    BACKOFF = 0.9  # the limit, as a share of what the service accepted
    GROWTH = 0.05  # each second: this much more
    FLOOR = 1.0
    UNLIMITED = 10_000.0  # a limit grown past this is dropped

    def __init__(self, service: str = "") -> None:
        self.service = service
        self.limit: float | None = None
        self._next = 0.0  # when the next request may start (monotonic)
        self._grown = 0.0  # when the limit last changed
        self._cut = -math.inf  # when the limit was last cut: answers to requests sent before are not counted twice
        self._answers: deque[tuple[float, bool]] = deque()  # (when, throttled) over the last window
        self._throttled = 0  # throttled answers among them
        self._lock = threading.Lock()

    def reserve(self, latest: float) -> float | None:
        """A start time for one request, at most ``latest`` (monotonic); None, reserving nothing, when the limit
        leaves no turn before then."""
        now = time.monotonic()
        if self.limit is None:  # the common case, read without the lock: a stale None only lets one request through
            return now
        with self._lock:
            limit = self._grown_limit(now)
            if limit is None:
                return now
            start = max(now, self._next)
            if start > latest:
                return None
            self._next = start + 1.0 / limit
            return start

    def answered(self, sent: float, *, throttled: bool, outstanding: int = 0) -> float | None:
        """An answer to a request sent at ``sent`` (monotonic), ``outstanding`` others still unanswered; the new
        limit when this answer cut it, else None."""
        now = time.monotonic()
        with self._lock:
            self._answers.append((now, throttled))
            self._throttled += throttled
            while self._answers[0][0] < now - self.WINDOW_SECONDS:
                self._throttled -= self._answers.popleft()[1]
            if not throttled or sent < self._cut or now < self._cut + self.WINDOW_SECONDS:
                return None  # cut at most once a window: answers to requests sent at the old rate settle first
            answers = len(self._answers)
            if answers < self.MIN_ANSWERS or self._throttled < self.ENGAGE_SHARE * answers:
                return None
            accepted = (answers - self._throttled + outstanding) / self.WINDOW_SECONDS
            self.limit = max(self.FLOOR, min(self.limit or math.inf, accepted) * self.BACKOFF)
            self._cut = self._grown = now
            self._next = max(self._next, now + 1.0 / self.limit)
            return self.limit

    def _grown_limit(self, now: float) -> float | None:
        """The limit raised for the time gone by since it last changed (the caller holds the lock)."""
        if self.limit is not None:
            self.limit *= (1.0 + self.GROWTH) ** (now - self._grown)
            self._grown = now
            if self.limit > self.UNLIMITED:
                self.limit = None
        return self.limit
