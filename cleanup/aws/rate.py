"""The rate a throttling service accepts, learnt from its answers, and requests spaced to it (``pacing.Gate.rate``).

AWS request quotas are token buckets: so many requests a second, with a burst on top. A client sending faster gets
a share of its requests throttled that grows with its rate: ``(sent - quota) / sent``. A service overloaded for a
moment throttles a small share whatever the rate. ``Rate`` tells the two apart by that share:

* Unlimited until, over the last second (at least MIN_ANSWERS answers), ENGAGE_SHARE or more of the answers were
  throttled. The limit is then set just under what the service accepted over that second, the requests still
  unanswered counted in (a throttling answer comes back faster than an accepted one, so at the first throttling the
  requests it let through may not have answered yet).
* With a limit known, the same happens again whenever the share is that high again among the answers to requests
  sent since the last cut (those sent before were spaced for the old limit): over the last second, or over the last
  MIN_ANSWERS_LIMITED answers when the second holds fewer (a quota of a few requests a second gives few answers in
  a second: without reaching back, the limit would grow far past it before its throttling counted), never further
  back than MAX_WINDOW_SECONDS; the limit is then just under what was accepted over that window.
* Scattered throttling (a lower share) cuts nothing: lowering the rate would not lower it, and a rate cut on every
  such answer would soon reach nothing at all.
* Each second the limit grows by GROWTH, so that a raised quota is found again; grown far past anything asked, it is
  dropped.

Requests are spaced to the limit (``reserve``), shared by every thread of the process; a request whose turn would
come after its caller's deadline is not given one. A cut takes effect at once: turns given before it were spaced for
the rate the service refused, and a request whose turn was given before the last cut reserves another when it comes
(``current``), so that the requests queued at the old spacing do not go on throttling for as long as the queue.

botocore's own adaptive retry mode does much the same, but its token bucket waits for a token with no deadline, it
belongs to one client (the Management API has one per endpoint), and it cuts the rate at every throttling answer, so
that scattered throttling drives it towards nothing.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque


class Rate:
    """Requests per second a service accepts, learnt from its answers; ``limit`` None: no limit known."""

    WINDOW_SECONDS = 1.0  # quotas are counted per second
    MIN_ANSWERS = 10  # fewer answers than this say too little about a share: the window reaches back to this many
    MAX_WINDOW_SECONDS = 10.0  # but no further back than this
    MIN_ANSWERS_LIMITED = 8  # with a limit known, fewer do: throttling past it says the limit outgrew the quota
    ENGAGE_SHARE = 0.2  # a throttled share this high says the requests are over a quota
    BACKOFF = 0.9  # the limit, as a share of what the service accepted
    GROWTH = 0.05  # each second: this much more
    GROWTH_LEAST = 0.2  # and at least this many requests a second more (a limit cut low comes back in seconds)
    FLOOR = 1.0
    UNLIMITED = 10_000.0  # a limit grown past this is dropped

    def __init__(self, service: str = "") -> None:
        self.service = service
        self.limit: float | None = None
        self._next = 0.0  # when the next request may start (monotonic)
        self._grown = 0.0  # when the limit last changed
        self._cut = -math.inf  # when the limit was last cut: answers to requests sent before are not counted
        self._answers: deque[tuple[float, bool]] = deque()  # (when, throttled) over the window
        self._since = -math.inf  # where the window starts: the last cut, or the last answer dropped from it
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

    def current(self, reserved: float) -> bool:
        """Whether a turn reserved at ``reserved`` (monotonic) was given at the current limit: one given before the
        last cut is spaced for a rate the service refused, and is reserved again."""
        return reserved >= self._cut

    def answered(self, sent: float, *, throttled: bool, outstanding: int = 0) -> float | None:
        """An answer to a request sent at ``sent`` (monotonic), ``outstanding`` others still unanswered; the new
        limit when this answer cut it, else None."""
        now = time.monotonic()
        with self._lock:
            if sent <= self._cut:
                return None  # a request sent at the rate before the last cut says nothing about the rate since
            self._answers.append((now, throttled))
            self._throttled += throttled
            least = self.MIN_ANSWERS if self.limit is None else self.MIN_ANSWERS_LIMITED
            while self._answers[0][0] < now - self.MAX_WINDOW_SECONDS or (
                self._answers[0][0] < now - self.WINDOW_SECONDS and len(self._answers) > least
            ):
                self._since, dropped = self._answers.popleft()
                self._throttled -= dropped
            answers = len(self._answers)
            if not throttled or answers < least or self._throttled < self.ENGAGE_SHARE * answers:
                return None
            # Unlimited: what was accepted over the last second. Limited: over the window, which begins no earlier
            # than the last cut (its answers were all to requests spaced at the limit, so it spans at least that).
            span = self.WINDOW_SECONDS if self.limit is None else max(now - self._since, answers / self.limit)
            accepted = (answers - self._throttled + outstanding) / span
            self.limit = max(self.FLOOR, min(self.limit or math.inf, accepted) * self.BACKOFF)
            self._cut = self._grown = self._since = now
            self._next = now + 1.0 / self.limit  # turns given before are reserved again (``current``)
            self._answers.clear()  # the next cut is judged on answers to requests sent at the new rate
            self._throttled = 0
            return self.limit

    def _grown_limit(self, now: float) -> float | None:
        """The limit raised for the time gone by since it last changed (the caller holds the lock)."""
        if self.limit is not None:
            elapsed = now - self._grown
            self.limit = self.limit * (1.0 + self.GROWTH) ** elapsed + self.GROWTH_LEAST * elapsed
            self._grown = now
            if self.limit > self.UNLIMITED:
                self.limit = None
        return self.limit
