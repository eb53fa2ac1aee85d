"""The rate a throttling service accepts, learnt from its answers, and requests spaced to it (``pacing.Lane.rate``).

AWS request quotas are token buckets: so many requests a second, with a second's worth of burst. A client sending at
a rate ``r`` over a quota ``Q`` has ``1 - Q / r`` of its requests throttled; under it, none. A service overloaded for a
while throttles a share whatever the rate (S3's ``SlowDown``): background. The law (docs/decides.md, "Slow and
throttling dependencies, and the Lambda deadline", where each constant's value is argued):

* **Rounds.** Answers are judged in rounds of at least ROUND_ANSWERS answers and ROUND_SECONDS, at most LONGEST_ROUND;
  answers to requests sent before the limit was last lowered are not counted. Requests still in flight count as not
  throttled: throttling answers come back first, and right after a burst most of what the quota let through has not
  answered yet. A round's rate is that of the turns that came in it, not of those given in it for later.
* **A target.** The limit is aimed where a quota would throttle the background share plus TARGET: a round paced at
  ``r`` (the limit, when it held requests back; else what was sent) with a throttled share ``s`` says a quota lets
  ``r (1 - s)`` through, so the limit aimed at is ``r (1 - s) / (1 - background - TARGET)``. Over that share, the
  limit is lowered ``n / (n + DAMPING)`` of the way there (in logarithms) after a round of ``n`` answers, or the share
  of the way that its nats of evidence over the target, and over the fitted rounds' share, are of ALARM, where that is
  further (a round of a few requests a second holds few answers, however sure they are); and all the way when the
  share is over them (a run of scattered throttling is no alarm) by ALARM nats and the logarithm of the answers
  counted (it is looked at after every answer, as the surge is), which also ends the round at once (a first burst, a
  quota lowered). The first
  round's alarm counts the quota's burst in what it let through, over the time the burst was sent in and a second;
  each of its requests counted as let through while in flight that then answers throttled takes its share off the
  limit, until the next round ends. A limit aimed at a quota's share rather than just
  under the quota keeps it full: several senders on one quota, each seeing the share of all, aim together at the same
  point.
* **A surge.** While a limit is set, Page's CUSUM of the round's answers watches for the share a rate SURGE times
  over such a quota would throttle (over the fitted rounds' share, where that is higher); sure by ALARM nats and the
  logarithm of the answers it could have begun at, it ends the round as an alarm does, the limit aimed from the
  surge's own answers (a quota lowered in the middle of a round: the answers before it say nothing of it), and the
  fit starts anew (fitted with the rounds after it, the round's admitted answers read as background).
* **Growth.** Under the target, and only while the limit holds requests back (a limit that holds nothing back says
  nothing of the quota), the limit grows on CUBIC's curve in logarithms: back towards the limit it was lowered from
  (the plateau), slower as it nears it, then past it, faster the longer it grows, never by more than STEP an answer
  of the round that grows it. Grown only while it holds requests back, a limit never outgrows the demand by more than
  a round's growth, and is kept.
* **Background, told by a fit.** Over the last ROUNDS rounds (FIT_ROUNDS at least), the answers are explained two
  ways: the same share at every rate (background), and a quota, the best one for the rounds; rounds at one rate are
  explained as well by either, so only rates that differ tell them apart. When background explains them better by
  VERDICT nats, and their share is over the target by VERDICT nats, that share is taken as the background (at most
  MAX_BACKGROUND) and the limit is put back where it was before (none, if none); an alarm in the round after puts the
  background back too (a quota shared with senders whose moves this one does not see). A quota explaining them better
  by VERDICT nats brings a background down to the share at the slowest rate. Rounds whose slower half, or newest,
  throttle surely more than the rest (Z standard errors) are neither: the quota changed, and the fit starts anew.
  Until a fit says otherwise, the background is PRIOR. The fitted rounds' share is the share pooled over them, once
  there are FIT_ROUNDS of them (one round is no measure of what is usual: after a quota changed, its first round).

The limit is never below FLOOR. Requests are spaced to the limit (``reserve``), shared by every thread of the
process; a request whose turn would come after its caller's deadline is not given one. A change takes effect at once,
either way: a request waiting for a turn given before a decrease, or before a growth, is woken and reserves another
(``wait``), so that the requests queued at the old spacing neither go on throttling for as long as the queue nor
hold a grown limit to the old pace while the next rounds judge it. botocore's own adaptive retry mode (CUBIC too) cuts
the rate at every throttling answer, so that scattered throttling drives it towards nothing; its token bucket waits
for a token with no deadline, and it belongs to one client (the Management API has one per endpoint).
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass


def evidence(share: float, expected: float, answers: float) -> float:
    """Nats of evidence that ``answers`` with a throttled ``share`` came from a share over ``expected`` (0 when the
    share is not over it): the binomial tail's Chernoff exponent, ``answers * KL(share || expected)``."""
    if share <= expected:
        return 0.0
    expected = min(max(expected, 1e-6), 1.0 - 1e-6)
    total = share * math.log(share / expected) if share > 0.0 else 0.0
    if share < 1.0:
        total += (1.0 - share) * math.log((1.0 - share) / (1.0 - expected))
    return answers * total


@dataclass(frozen=True, slots=True)
class Round:
    """A round's answers: how many were throttled, how many counted, and the rate they were sent at."""

    throttled: float
    answers: int
    rate: float


def pooled(rounds: Sequence[Round]) -> float:
    """The throttled share of all the answers of ``rounds`` (at least one)."""
    return sum(r.throttled for r in rounds) / sum(r.answers for r in rounds)


def background_odds(rounds: Sequence[Round], background: float) -> tuple[float, float]:
    """The throttled share pooled over ``rounds``, and the nats by which the same share at every rate explains their
    answers better than the best quota does (a quota ``Q`` throttling ``1 - Q / r`` of a rate ``r`` over it, and the
    ``background`` share of the rest; each round's ``r (1 - s)`` is tried for ``Q``)."""
    share = pooled(rounds)
    flat = sum(_likelihood(r, share) for r in rounds)
    best = -math.inf
    for trial in rounds:
        quota = trial.rate * (1.0 - trial.throttled / trial.answers)
        best = max(best, sum(_likelihood(r, 1.0 - (1.0 - background) * min(1.0, quota / r.rate)) for r in rounds))
    return share, flat - best


def changed(rounds: Sequence[Round], z: float) -> bool:
    """Whether the slower half of ``rounds`` throttled surely (``z`` standard errors) more than the faster half, or the
    newest surely (twice that) more than the rest: neither a quota nor background does; a quota that changed does."""
    ordered = sorted(rounds, key=lambda r: r.rate)
    half = len(ordered) // 2
    newest = rounds[-1]
    return _over(ordered[:half], ordered[half:], z) or _over([newest], [r for r in rounds if r is not newest], 2 * z)


def _over(some: Sequence[Round], others: Sequence[Round], z: float) -> bool:
    (t1, n1), (t2, n2) = ((sum(r.throttled for r in part), sum(r.answers for r in part)) for part in (some, others))
    share = (t1 + t2) / (n1 + n2)
    error = math.sqrt(max(share * (1.0 - share), 1e-9) * (1.0 / n1 + 1.0 / n2))
    return (t1 / n1 - t2 / n2) / error > z


def _likelihood(round_: Round, share: float) -> float:
    share = min(max(share, 0.01), 0.99)
    return round_.throttled * math.log(share) + (round_.answers - round_.throttled) * math.log(1.0 - share)


class Rate:
    """Requests per second a service accepts, learnt from its answers; ``limit`` None: no limit known."""

    TARGET = 0.05  # the throttled share over the background the limit is aimed at
    PRIOR = 0.03  # the background share until a fit says otherwise
    ALARM = math.log(1000.0)  # nats (and the logarithm of its answers): a round this surely over the target ends at
    # once, lowered all the way
    ROUND_ANSWERS = 20  # a round holds at least this many answers
    ROUND_SECONDS = 1.0  # and spans at least this long (a quota is counted per second)
    LONGEST_ROUND = 3.0  # seconds: a round ends then, however few its answers (a few requests a second)
    MIN_ANSWERS = 8  # an alarm needs this many answers, and a round this many to be fitted
    SURGE = 4.0  # a surge: a rate this many times what a quota at the target lets through
    DAMPING = 10.0  # answers: a round of n answers lowers the limit at least n / (n + DAMPING) of the way it says
    CUBIC = 4e-4  # per second cubed: the growth curve, in logarithms (a 10% decrease regrown in 6.4 s)
    STEP = 0.07  # per answer of the round that grows it, at most (between two looks at the quota, as much at any rate)
    ROUNDS = 12  # the rounds fitted
    FIT_ROUNDS = 4  # the fewest rounds fitted
    VERDICT = math.log(100.0)  # nats: what tells background from a quota, either way
    Z = 2.0  # standard errors: what says the quota changed
    MAX_BACKGROUND = 0.3  # throttling beyond this share is not taken for background
    FLOOR = 0.2  # requests a second: the lowest limit (each halving gains less, and doubles a stall at it)

    def __init__(self, service: str = "", clock: Callable[[], float] = time.monotonic) -> None:
        self.service = service
        self.limit: float | None = None
        self.background = self.PRIOR  # the throttled share that lowering the rate does not lower
        self._clock = clock
        self._next = 0.0  # when the next request may start (monotonic)
        self._spaced = -math.inf  # when the turns given were last given again (a decrease; a growth past turns given
        # for later): those given before are reserved again (``current``), their callers woken (``wait``)
        self._start = clock()  # when the round started: answers to requests sent before are not counted
        self._answers = 0
        self._throttled = 0
        self._given = 0  # turns of the round that have come (their requests sent, or about to be)
        self._later: list[float] = []  # turns given for later, not yet come (a heap of their times)
        self._waited = False  # whether a request of the round waited for its turn
        self._first = True  # the first round: the quota's burst is whole
        self._span = (math.inf, -math.inf)  # the first round's first and last turn: the time its burst was sent over
        self._burst = (0, 0.0)  # the first burst's calls in flight, counted as let through, and what each added to the
        # limit: one that answers throttled takes it off, until the next round ends
        self._usual = 0.0  # the share the fitted rounds throttled, pooled, once FIT_ROUNDS are held (at most
        # MAX_BACKGROUND + TARGET): an alarm or a surge is over it
        self._surge = 0.0  # nats: the round's CUSUM for a surge (``_watch``)
        self._calm = (0, 0)  # the round's answers, and throttled ones, when it was last at zero
        self._probe: float | None = None  # the background before a verdict, while the round after it probes
        self._highest = math.inf  # the highest limit since the last verdict (inf: none), put back for background
        self._plateau = 0.0  # the limit the growth curve flattens at (CUBIC's W_max)
        self._grown = 0.0  # seconds grown on the curve since the limit was last lowered
        self._climb = 0.0  # seconds from the lowered limit to the plateau (CUBIC's K)
        self._rounds: deque[Round] = deque(maxlen=self.ROUNDS)
        self._lock = threading.Lock()
        self._respaced = threading.Condition(self._lock)  # notified when turns given before are given again

    def reserve(self, latest: float) -> float | None:
        """A start time for one request, at most ``latest`` (monotonic); None, reserving nothing, when the limit
        leaves no turn before then."""
        now = self._clock()
        if self.limit is None:  # the common case, read without the lock: a stale None only lets one request through
            self._unlimited(now)
            return now
        with self._lock:
            if self.limit is None:
                self._unlimited(now)
                return now
            start = max(now, self._next)
            if start > latest:
                return None
            self._next = start + 1.0 / self.limit
            if start > now:
                self._waited = True
                heapq.heappush(self._later, start)
            else:
                self._given += 1
            return start

    def _unlimited(self, now: float) -> None:
        """A turn given at ``now``, with no limit."""
        self._given += 1
        if self._first:
            self._span = (min(self._span[0], now), now)

    def seed(self, limit: float) -> bool:
        """Start at ``limit`` requests a second, learnt by another process on the same quota (the stream's worker, for
        the backlog it deferred to: ``Pacer.seed``), while this rate has learnt no limit of its own; whether it was
        taken. At least FLOOR; a limit however high paces nothing, as none does. Without it, a new process's first
        burst to a quota its sender has used up is throttled as a whole before a limit is set."""
        with self._lock:
            taken = self.limit is None and math.isfinite(limit)
            if taken:
                seeded = max(limit, self.FLOOR)
                self._set(seeded, plateau=seeded)
                self._first = False  # the quota's burst is not whole: the sender has been using it
                self._new_round(self._clock(), lowered=True)
            return taken

    def current(self, reserved: float) -> bool:
        """Whether a turn reserved at ``reserved`` (monotonic) still holds: one given before the limit was last lowered
        was spaced for a rate the service refused, and one given for later before it grew for the rate before; either
        is reserved again."""
        return reserved >= self._spaced

    def wait(self, reserved: float, turn: float) -> bool:
        """Wait for a ``turn`` (monotonic) reserved at ``reserved``: whether it still holds when it comes, or False as
        soon as the limit changes first (the turn was spaced for a rate since refused, or since grown past)."""
        if turn <= self._clock():  # the common case, a turn at once: no need for the lock
            return self.current(reserved)
        with self._respaced:
            while self.current(reserved):
                left = turn - self._clock()
                if left <= 0.0:
                    return True
                self._respaced.wait(left)
            return False

    def answered(self, sent: float, *, throttled: bool, outstanding: int = 0) -> float | None:
        """An answer to a request sent at ``sent`` (monotonic), ``outstanding`` others still unanswered; the new
        limit when this answer lowered it, else None."""
        with self._lock:
            now = self._clock()
            if sent < self._start:  # sent before the round: at a limit since lowered
                calls, each = self._burst
                if not (throttled and calls and self.limit is not None):
                    return None
                self._burst = (calls - 1, each)
                lowered = max(self.FLOOR, self.limit - each)  # the first burst counted it as let through
                self._set(lowered, plateau=lowered)
                self._respace(now, min(self._next, now + 1.0 / lowered))
                return lowered
            self._answers += 1
            self._throttled += throttled
            elapsed = now - self._start
            self._come(now)
            counted = max(self._answers, min(self._answers + outstanding, self._given))  # in flight: not throttled
            expected = self.background + self.TARGET
            surge = self._watch(throttled=throttled, expected=expected, in_flight=counted - self._answers)
            alarm = (
                throttled
                and counted >= self.MIN_ANSWERS
                and evidence(self._throttled / counted, max(expected, self._usual), counted)
                >= self.ALARM + math.log(counted)
            )
            full = self._answers >= self.ROUND_ANSWERS and elapsed >= self.ROUND_SECONDS
            if not (alarm or surge or full or elapsed >= self.LONGEST_ROUND):
                return None
            return self._close(now, elapsed, counted, alarm=alarm, surge=None if alarm else surge)

    def _watch(self, *, throttled: bool, expected: float, in_flight: int) -> tuple[int, int] | None:
        """Page's CUSUM of the round's answers for a surge: the share a rate SURGE times what a quota lets through would
        have throttled, the quota's share being the ``expected`` one, or the fitted rounds' where that is higher (a
        surge over what scattered throttling has been throwing, not a run of it). While a limit is set: the answers
        since the surge began (those in flight among them, counted as not throttled) and the throttled ones among them,
        once it is surely one (ALARM nats, and the logarithm of the answers it could have begun at); else None (the
        caller holds the lock)."""
        over = max(expected, self._usual)
        surge = 1.0 - (1.0 - over) / self.SURGE
        up, down = math.log(surge / over), math.log((1.0 - surge) / (1.0 - over))
        self._surge += up if throttled else down
        if self._surge <= 0.0:
            self._surge, self._calm = 0.0, (self._answers, self._throttled)
        sure = self._surge + in_flight * down >= self.ALARM + math.log(self._answers)
        if self.limit is None or not throttled or not sure:
            return None
        return self._answers - self._calm[0] + in_flight, self._throttled - self._calm[1]

    def _close(
        self, now: float, elapsed: float, counted: int, *, alarm: bool, surge: tuple[int, int] | None = None
    ) -> float | None:
        """The round ends with ``counted`` answers (those in flight among them), on an ``alarm``, a ``surge`` (its
        answers and throttled ones) or in time: the new limit if lowered (the caller holds the lock)."""
        before, waited = self.limit, self._waited
        first, self._first = self._first, False
        self._burst = (0, 0.0)
        sent = max(self._given, self._answers)  # the turns come by now: ``answered`` counted them
        answers = Round(self._throttled, counted, max(sent / max(elapsed, 1e-3), 1e-3))
        self._highest = max(self._highest, math.inf if before is None else before)
        self._keep(answers, burst=before is None and alarm, changed=surge is not None)
        probe, self._probe = self._probe, None
        if self._background():
            self._new_round(now, lowered=True)
            return None
        alarm |= surge is not None
        if alarm and probe is not None:  # the limit put back for background found a quota: it was not background
            self.background = probe
        share = answers.throttled / answers.answers
        expected = self.background + self.TARGET
        if share <= expected and not alarm:
            if before is not None and waited:
                self._grow(now, before, elapsed, answers.answers)
            self._new_round(now, lowered=False)
            return None
        if before is None and not alarm:
            self._new_round(now, lowered=False)
            return None
        # The pace the answers were sent at: the limit, where it held requests back (a batch's calls go at its pace),
        # else what was sent; and where a quota letting through what this round's did would throttle the target.
        paced = before if before is not None and waited else answers.rate
        # A surge's own answers say what gets through now; the whole round's, what got through before it too.
        seen, throttled = surge or (answers.answers, answers.throttled)
        let_through = 1.0 - (throttled + 0.5) / (seen + 1.0)  # all throttled: not none let through
        aimed = paced * let_through / (1.0 - expected)
        if first:  # what the first burst let through includes the quota's burst, a second's worth
            burst = 1.0 / (max(self._span[1] - self._span[0], 0.0) + 1.0) / (1.0 - expected)
            if (answers.answers - answers.throttled) * burst < aimed:
                aimed, self._burst = (answers.answers - answers.throttled) * burst, (counted - self._answers, burst)
        gain = self._gain(share, expected, answers.answers, alarm=alarm)
        limit = max(self.FLOOR, paced * math.pow(aimed / paced, gain))
        if before is not None and limit >= before:
            self._new_round(now, lowered=False)
            return None
        # The curve flattens at the limit before (found too high, only just), or, far over a quota (a first burst, a
        # quota lowered: more throttled than any background), at the quota's rate as this round shows it.
        far = share > self.MAX_BACKGROUND + self.TARGET
        self._set(limit, plateau=max(limit, aimed if before is None or far else before))
        self._new_round(now, lowered=True)
        return limit

    def _keep(self, answers: Round, *, burst: bool, changed: bool) -> None:
        """Keep a round's ``answers`` for the fit: not a ``burst``'s sent with no limit, ended by an alarm (its admitted
        calls are still in flight), nor too few; a round the quota ``changed`` in (a surge) starts the fit anew (the
        caller holds the lock)."""
        if changed:
            self._rounds.clear()
        elif answers.answers >= self.MIN_ANSWERS and not burst:
            self._rounds.append(answers)

    def _gain(self, share: float, expected: float, answers: int, *, alarm: bool) -> float:
        """How far, in logarithms, a round of ``answers`` throttled over the ``expected`` share lowers the limit towards
        where its ``share`` aims it: all the way on an alarm; else ``n / (n + DAMPING)`` of the way, or the share of
        ALARM that its nats of evidence over the expected share (and the fitted rounds') are, where that is further."""
        if alarm:
            return 1.0
        sure = evidence(share, max(expected, self._usual), answers) / self.ALARM
        return min(1.0, max(sure, answers / (answers + self.DAMPING)))

    def _background(self) -> bool:
        """Fit the rounds: when the throttling is background, take its share and put the limit back where it was (the
        caller holds the lock, and starts a round when this says True)."""
        rounds = self._rounds
        if len(rounds) < self.FIT_ROUNDS:
            return False
        if changed(rounds, self.Z):
            newest = rounds[-1]
            rounds.clear()
            rounds.append(newest)
            return False
        share, odds = background_odds(rounds, self.background)
        answers = sum(r.answers for r in rounds)
        if odds >= self.VERDICT and evidence(share, self.background + self.TARGET, answers) >= self.VERDICT:
            self._probe = self.background
            self.background = min(self.MAX_BACKGROUND, share)
            rounds.clear()
            limit = None if self._highest == math.inf else self._highest
            self._set(limit, plateau=limit or 0.0)
            self._highest = math.inf if limit is None else limit
            return True
        if odds <= -self.VERDICT:  # a quota: the background no more than the share at the slowest rate
            slowest = min(rounds, key=lambda r: r.rate)
            self.background = min(self.background, slowest.throttled / slowest.answers)
        return False

    def _grow(self, now: float, before: float, elapsed: float, answers: int) -> None:
        """Grow the limit along the curve for ``elapsed`` seconds more to ``now``, judged on ``answers`` (the caller
        holds the lock)."""
        self._grown += elapsed
        curve = math.log(self._plateau / before) + self.CUBIC * (self._grown - self._climb) ** 3
        self.limit = before * math.exp(min(max(curve, 0.0), self.STEP * answers))
        if self.limit > before and self._later:  # turns given for later were spaced for the limit before
            self._respace(now, now + 1.0 / self.limit)

    def _set(self, limit: float | None, *, plateau: float) -> None:
        """Set the limit, and the growth curve from it to ``plateau`` (the caller holds the lock)."""
        self.limit = limit
        self._plateau, self._grown = plateau, 0.0
        self._climb = 0.0 if limit is None else math.cbrt(math.log(plateau / limit) / self.CUBIC)

    def _come(self, now: float) -> None:
        """Count the turns given for later that have come by ``now`` as the round's (the caller holds the lock)."""
        while self._later and self._later[0] <= now:
            heapq.heappop(self._later)
            self._given += 1

    def _respace(self, now: float, next_turn: float) -> None:
        """Give again every turn given before ``now``, the next at ``next_turn``, and wake their callers (the caller
        holds the lock)."""
        self._spaced, self._next = now, next_turn
        self._later.clear()
        self._respaced.notify_all()

    def _new_round(self, now: float, *, lowered: bool) -> None:
        """A round starts (the caller holds the lock); ``lowered``: the limit was lowered, or set anew, and turns given
        before are reserved again."""
        self._start = now
        self._answers = self._throttled = 0
        self._surge, self._calm = 0.0, (0, 0)
        self._usual = 0.0
        if len(self._rounds) >= self.FIT_ROUNDS:
            self._usual = min(pooled(self._rounds), self.MAX_BACKGROUND + self.TARGET)
        self._given = 0
        if lowered:
            self._respace(now, now + (0.0 if self.limit is None else 1.0 / self.limit))
        self._waited = bool(self._later)  # turns given for later are the new round's, and waited
