"""The pacing law before the present one (``cleanup.aws.rate``), kept for the pacing model's side-by-side table
(``benchmarks.pacing``): the rate learnt by judging each cut, as the worker ran it until the law was replaced.

A cut set the limit just under what the service accepted over a window of about 20 answers; the 16 answers after it
judged it: the throttling stopped (a quota: kept), rose (another sender: cut again), or did not change (background:
undone, and that share taken as the background, forgotten by half every BACKGROUND_HALF_LIFE); each request that
waited for its turn raised the limit by GROWTH. Judged on so few answers, scattered throttling ratchets it down, and
senders sharing a quota undo each other's cuts (benchmarks/README.md, section 9c).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


class JudgedRate:
    """The law before: requests per second a service accepts, learnt from its answers; ``limit`` None: none known."""

    WINDOW_SECONDS = 1.0  # quotas are counted per second
    MIN_SPAN_SECONDS = 0.25  # what was accepted is counted over no less than this
    MAX_WINDOW_SECONDS = 10.0  # a window reaches back to DETECT_ANSWERS answers, but no further than this
    MIN_ANSWERS = 8  # fewer answers than this say too little about a share
    MIN_THROTTLED = 4  # nor do fewer throttled answers than this
    DETECT_ANSWERS = 20  # a window holds this many answers, so that a share of ENGAGE_SHARE is MIN_THROTTLED of them
    JUDGE_ANSWERS = 16  # answers to requests sent after a cut that judge it
    KEEP_DOUBT = 0.05  # a cut is kept once that many unthrottled answers in a row would be this unlikely at its share
    ENGAGE_SHARE = 0.2  # a throttled share this much above the background says the requests are over a quota
    MAX_BACKGROUND = 0.4  # throttling beyond this share is not taken for background
    BACKGROUND_HALF_LIFE = 20.0  # seconds: the background share is forgotten by half in this time
    BACKOFF = 0.9  # the limit, as a share of what the service accepted
    GROWTH = 0.006  # each request that waits for its turn: this much more
    REGAIN = 0.05  # and this much more below REGAIN_AT of the limit a kept cut was cut from
    REGAIN_AT = 0.8
    FLOOR = 1.0
    UNLIMITED = 10_000.0  # a limit grown past this is dropped

    def __init__(self, service: str = "", clock: Callable[[], float] = time.monotonic) -> None:
        self.service = service
        self.limit: float | None = None
        self.background = 0.0  # the throttled share that sending slower did not lower
        self._noted = 0.0  # when the background share was last brought up to date
        self._clock = clock
        self._next = 0.0  # when the next request may start (monotonic)
        self._cut = -math.inf  # when the limit was last cut: answers to requests sent before are not counted
        self._spaced = -math.inf  # when the limit was last lowered: turns given before are reserved again
        self._regain = 0.0  # below this limit, it grows by REGAIN
        self._judging: tuple[float | None, float] | None = None  # the limit before the last cut, the share that cut it
        self._counted: _Count | None = None  # what the last cut counted, while requests it counted half are answered
        self._answers: deque[tuple[float, bool]] = deque()  # (when, throttled) over the window
        self._since = -math.inf  # where the window starts: the last cut, or the last answer dropped from it
        self._throttled = 0  # throttled answers among them
        self._lock = threading.Lock()

    def reserve(self, latest: float) -> float | None:
        """A start time for one request, at most ``latest`` (monotonic); None, reserving nothing, when the limit
        leaves no turn before then."""
        now = self._clock()
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

    def seed(self, limit: float) -> bool:
        """Start at ``limit`` requests a second, learnt by another process on the same quota (the stream's worker, for
        the backlog it deferred to: ``Pacer.seed``), while this rate has learnt no limit of its own; whether it was
        taken. Bounded to FLOOR..UNLIMITED. It is then cut, or grows, as a learnt limit does; unjudged, since
        nothing cut it here. Without it, a new process's first burst to a quota its sender has used up is throttled
        as a whole before it is cut."""
        if not math.isfinite(limit):
            return False
        with self._lock:
            if self.limit is not None:
                return False
            now = self._clock()
            self.limit = min(max(limit, self.FLOOR), self.UNLIMITED)
            # The window starts here, as at a cut: what is accepted since is counted over the time since, not over
            # a window reaching back to the start.
            self._restart(now, now)
            return True

    def current(self, reserved: float) -> bool:
        """Whether a turn reserved at ``reserved`` (monotonic) still holds: one given before the last cut was spaced
        for a rate the service refused, and is reserved again."""
        return reserved >= self._spaced

    def answered(self, sent: float, *, throttled: bool, outstanding: int = 0) -> float | None:
        """An answer to a request sent at ``sent`` (monotonic), ``outstanding`` others still unanswered; the new
        limit when this answer cut it, else None."""
        now = self._clock()
        with self._lock:
            if sent < self._cut:  # sent at the rate before the last cut: says nothing about the rate since
                self._recount(now, throttled)  # but about that rate
                return None
            if self.background:  # forgotten as time goes by: another sender's excess on the quota can pass for it
                self.background *= 0.5 ** ((now - self._noted) / self.BACKGROUND_HALF_LIFE)
            self._noted = now
            self._answers.append((now, throttled))
            self._throttled += throttled
            least = self.DETECT_ANSWERS if self._judging is None else self.JUDGE_ANSWERS
            while (self._judging is None and self._answers[0][0] < now - self.MAX_WINDOW_SECONDS) or (
                self._answers[0][0] < now - self.WINDOW_SECONDS and len(self._answers) > least
            ):
                self._since, dropped = self._answers.popleft()
                self._throttled -= dropped
            answers = len(self._answers)
            if self._judging is not None and not self._throttled:
                # Nothing throttled since the cut: kept as soon as so many unthrottled answers in a row would be
                # unlikely had sending slower not lowered the throttling (at half the share that made the cut, or
                # ENGAGE_SHARE over the background). At a limit cut low, 16 answers would take as many seconds.
                doubted = min(0.9, max(self.background + self.ENGAGE_SHARE, self._judging[1] / 2))
                if answers >= math.log(self.KEEP_DOUBT) / math.log(1.0 - doubted):
                    return self._judge(now, answers, 0.0, outstanding)
            if answers < self.MIN_ANSWERS:
                return None
            # Requests still unanswered are not throttled yet: throttling answers come back first, and right after a
            # burst the window holds mostly them.
            share = self._throttled / (answers + outstanding)
            high = throttled and self._throttled >= self.MIN_THROTTLED and share >= self.background + self.ENGAGE_SHARE
            if self._judging is not None and (answers >= least or high):  # still throttling that much: say so soon
                return self._judge(now, answers, share, outstanding)
            if self._judging is not None or not high:
                return None
            self._judging = (self.limit, share)
            return self._cut_to(now, answers, share, outstanding)

    def _judge(self, now: float, answers: int, share: float, outstanding: int) -> float | None:
        """Judge the last cut by the throttled ``share`` of the answers since; the new limit if it is cut again (the
        caller holds the lock)."""
        before, share_before = self._judging or (None, 0.0)
        self._judging = None
        if share < self.background + self.ENGAGE_SHARE / 4:
            self.background = min(self.background, (self.background + share) / 2)
            self._regain = (before or 0.0) * self.REGAIN_AT  # the quota is above the cut, and under what it cut
            return None  # a quota: the throttling came down with the rate
        rose = share >= share_before + self.ENGAGE_SHARE / 2 or share > self.MAX_BACKGROUND
        if rose and share >= self.background + self.ENGAGE_SHARE:
            self._judging = (before, share)  # another sender on the quota took what the cut gave back: a quota
            return self._cut_to(now, answers, share, outstanding)
        if share <= share_before - self.ENGAGE_SHARE / 2:  # came down with the rate: a quota
            if share < self.background + self.ENGAGE_SHARE:
                return None  # the rest is the quota's burst refilling, or another sender's: the cut stays
            self._judging = (before, share)  # but not enough: a cut not deep enough
            return self._cut_to(now, answers, share, outstanding)
        self.limit = before  # sending slower did not lower the throttling: back to the rate before, it is background
        self.background = min(share, self.MAX_BACKGROUND)
        self._restart(now, now)  # turns given at the cut's spacing are reserved again
        return None

    def _cut_to(self, now: float, answers: int, share: float, outstanding: int) -> float:
        """Cut the limit to just under what the service accepted over the window (the caller holds the lock)."""
        # Unlimited: what was accepted over the last second (a burst is let through on top of a quota), or since a
        # cut was undone, if that is less (counted over a second, the answers since would say half the rate or less).
        # Limited: over the window, which begins no earlier than the last cut (its answers were all to requests spaced
        # at the limit, so it spans at least that).
        if self.limit is None:
            span = min(self.WINDOW_SECONDS, max(now - self._since, self.MIN_SPAN_SECONDS))
        else:
            span = max(now - self._since, answers / self.limit)
        count = _Count(self.limit, span, self.background, answers - self._throttled, self._throttled, outstanding)
        self._counted = count if outstanding else None
        self._regain = 0.0
        self.limit = count.limit(self.FLOOR, self.BACKOFF)
        self._restart(now, now + 1.0 / self.limit)  # the cut is judged on answers to requests sent at the new rate
        return self.limit

    def _restart(self, now: float, first_turn: float) -> None:
        """The limit was set anew: the window starts empty, answers to requests sent before are not counted in it,
        turns given before are reserved again (``current``), the next at ``first_turn`` (the caller holds the lock)."""
        self._cut = self._spaced = self._since = now
        self._next = first_turn
        self._answers.clear()
        self._throttled = 0

    def _recount(self, now: float, throttled: bool) -> None:
        """An answer to a request unanswered at the last cut, which counted it half accepted: the cut, and the share it
        is judged against, are counted again with the answer as it is (the caller holds the lock).

        The requests in flight at a first burst's cut are its last, sent once the quota's burst was spent, and mostly
        throttled: counted half accepted, they set the limit a third over a quota of 5 a second, where the throttling
        goes on much as before the cut, and the cut was taken for background and undone."""
        count = self._counted
        if count is None or self._judging is None:
            return
        count.unanswered -= 1
        count.accepted += not throttled
        count.throttled += throttled
        if count.unanswered <= 0:
            self._counted = None
        limit = count.limit(self.FLOOR, self.BACKOFF)
        if self.limit is not None and limit < self.limit:  # the turns given at the higher rate are reserved again
            self._spaced = now
            self._next = now + 1.0 / limit
        self.limit = limit
        self._judging = (self._judging[0], count.throttled / (count.accepted + count.throttled + count.unanswered))

    def _grown_limit(self, now: float) -> float | None:
        """The limit raised by GROWTH (REGAIN below a kept cut's REGAIN_AT) if this request has to wait for its turn
        (the caller holds the lock). A limit that holds no request back says nothing of the quota: grown past it
        unseen, it would be found far over it when requests come faster (a sender held near the quota by its own pace,
        the backlog's drain, would grow it while it takes turns, and throttle more than the share that cuts it). Nor
        does it grow while a cut is judged: the judging answers are to requests sent at the cut's rate."""
        if self.limit is not None and self._next > now and self._judging is None:
            self.limit *= 1.0 + (self.REGAIN if self.limit < self._regain else self.GROWTH)
            if self.limit > self.UNLIMITED:
                self.limit = None
        return self.limit


@dataclass(slots=True)
class _Count:
    """What a cut counted: answers accepted and throttled over ``span`` seconds, and requests still unanswered (half
    of them counted accepted until they are answered), under a ``background`` share; ``prior``: the limit before."""

    prior: float | None
    span: float
    background: float
    accepted: int
    throttled: int
    unanswered: int

    def limit(self, floor: float, backoff: float) -> float:
        """Just under what the service accepted, and no higher than the limit before."""
        accepted = (self.accepted + self.unanswered / 2) / self.span / (1.0 - self.background)
        return max(floor, min(self.prior or math.inf, accepted) * backoff)
