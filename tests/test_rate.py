"""The rate learnt from throttling (``cleanup.aws.rate``): a quota is kept to, scattered throttling is not mistaken for
one, and no turn is given past a deadline."""

from __future__ import annotations

import itertools
import time

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
