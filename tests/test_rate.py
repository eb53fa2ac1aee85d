"""The rate learnt from throttling (``cleanup.aws.rate``): a quota is kept to, scattered throttling is not mistaken for
one, and no turn is given past a deadline."""

from __future__ import annotations

import itertools
import time

import pytest

from cleanup.aws.rate import Rate


def answer(rate: Rate, accepted: int, throttled: int, outstanding: int = 0) -> float | None:
    """Answers to requests sent now: the accepted ones first, then the throttled; the last cut, if any."""
    sent = time.monotonic()
    cut = None
    for _ in range(accepted):
        rate.answered(sent, throttled=False)
    for _ in range(throttled):
        cut = rate.answered(sent, throttled=True, outstanding=outstanding) or cut
    return cut


def test_a_high_throttled_share_spaces_requests_just_under_what_was_accepted() -> None:
    rate = Rate("kms")

    cut = answer(rate, accepted=20, throttled=30)

    assert cut is not None and rate.limit == cut
    assert 17.0 <= cut <= 18.0  # 0.9 of the 20 accepted this second
    now = time.monotonic()
    turns = [rate.reserve(now + 10) for _ in range(5)]
    given = [turn for turn in turns if turn is not None]
    assert len(given) == len(turns)
    assert all(abs(later - earlier - 1 / cut) < 0.01 for earlier, later in itertools.pairwise(given))


def test_requests_still_unanswered_are_counted_among_the_accepted() -> None:
    rate = Rate("kms")

    cut = answer(rate, accepted=4, throttled=16, outstanding=16)  # throttling answers come back first

    assert cut is not None and cut >= 0.9 * 20 - 1


def test_scattered_throttling_sets_no_limit() -> None:
    rate = Rate("s3")

    for _ in range(10):
        answer(rate, accepted=90, throttled=10)  # a tenth, whatever the rate: a transient overload

    assert rate.limit is None
    assert rate.reserve(time.monotonic()) is not None


def test_no_turn_is_given_past_the_deadline() -> None:
    rate = Rate("kms")
    answer(rate, accepted=2, throttled=30)  # cut to the floor-ish: a turn every half second or so
    now = time.monotonic()

    turns = [rate.reserve(now + 1.0) for _ in range(10)]

    given = [turn for turn in turns if turn is not None]
    assert given and len(given) < len(turns)
    assert all(turn <= now + 1.0 for turn in given)


class Clock:
    """A monotonic clock the test moves by hand (``cleanup.aws.rate`` reads its ``time.monotonic``)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def answer(self, rate: Rate, accepted: int, throttled: int) -> None:
        """Answers, now, to requests sent now: the accepted ones first."""
        for refused in [False] * accepted + [True] * throttled:
            rate.answered(self.now, throttled=refused)


def test_at_a_low_quota_a_limit_grown_past_it_is_cut_before_it_throttles_as_much_as_it_admits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A quota of 5 a second (a token bucket holding one second's worth), and callers always waiting to send: every
    # turn the rate gives is taken. Fewer than 20 answers come back in any second at that rate.
    clock = Clock()
    monkeypatch.setattr("cleanup.aws.rate.time", clock)
    rate, quota = Rate("kms"), 5.0
    clock.answer(rate, accepted=5, throttled=30)  # the first second, unpaced: a limit is set
    tokens, counted, admitted, throttled = quota, clock.now, 0, 0
    while admitted < 200:
        turn = rate.reserve(clock.now + 60)
        assert turn is not None
        clock.now = turn
        tokens, counted = min(quota, tokens + (turn - counted) * quota), turn
        refused = tokens < 1.0
        tokens -= 0.0 if refused else 1.0
        admitted, throttled = admitted + (not refused), throttled + refused
        rate.answered(turn, throttled=refused)

    assert throttled <= 0.25 * admitted
    assert admitted / (clock.now - 1000.0) >= 0.95 * quota


def test_a_turn_given_before_a_cut_is_not_current(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr("cleanup.aws.rate.time", clock)
    rate = Rate("kms")
    clock.answer(rate, accepted=20, throttled=30)
    reserved = clock.now
    queued = [rate.reserve(clock.now + 60) for _ in range(10)]  # spaced for the first limit
    clock.now += 2.0
    clock.answer(rate, accepted=2, throttled=30)  # cut again

    assert all(turn is not None for turn in queued)
    assert not rate.current(reserved)  # reserved again when it comes: the queue goes at the new spacing
    assert rate.current(clock.now)
