"""The rate learnt from throttling (``cleanup.aws.rate``): a quota is kept to, scattered throttling is not mistaken for
one, and no turn is given past a deadline."""

from __future__ import annotations

import itertools
import math
import threading
import time

import pytest

from cleanup.aws.rate import Rate, evidence
from tests.pace_sim import Service, drain, drive


def answer(rate: Rate, accepted: int, throttled: int, outstanding: int = 0) -> float | None:
    """Answers to requests sent now: the accepted ones first, then the throttled; the last cut, if any."""
    sent = time.monotonic()
    cut = None
    for _ in range(accepted):
        rate.answered(sent, throttled=False)
    for _ in range(throttled):
        cut = rate.answered(sent, throttled=True, outstanding=outstanding) or cut
    return cut


def test_scattered_throttling_sets_no_limit() -> None:
    rate = Rate("s3")

    for _ in range(10):
        answer(rate, accepted=90, throttled=10)  # a tenth, whatever the rate: a transient overload

    assert rate.limit is None
    assert rate.reserve(time.monotonic()) is not None


def test_no_turn_is_given_past_the_deadline() -> None:
    rate = Rate("kms")
    answer(rate, accepted=2, throttled=30)  # cut to about 2 a second: a turn every half second or so
    now = time.monotonic()

    turns = [rate.reserve(now + 1.0) for _ in range(10)]

    given = [turn for turn in turns if turn is not None]
    assert given and len(given) < len(turns)
    assert all(turn <= now + 1.0 for turn in given)


@pytest.mark.parametrize("quota", [3.0, 5.0, 20.0])
def test_a_quota_is_kept_to_with_few_throttled_answers(quota: float) -> None:
    # Over the last half of a minute of 16 callers with no end of requests, on a clock of the simulation's own.
    tally = drive(Service(quota=quota), 60.0, workers=16, since=30.0)

    assert tally.throttled <= 0.25 * tally.admitted
    assert tally.admitted >= 0.85 * quota * 30.0


@pytest.mark.parametrize(("share", "workers", "latency"), [(0.2, 8, 0.05), (0.2, 2, 0.2), (0.1, 8, 0.4)])
def test_random_throttling_keeps_the_rate(share: float, workers: int, latency: float) -> None:
    unthrottled = drive(Service(), 60.0, workers=workers, latency=latency, since=30.0)

    tally = drive(Service(random_share=share, seed=3), 60.0, workers=workers, latency=latency, since=30.0)

    assert tally.throttled > 0.75 * share * tally.sent  # that share was throttled
    assert tally.sent >= 0.8 * unthrottled.sent  # and requests went on at about the rate unthrottled


def test_random_throttling_keeps_the_rate_whatever_the_draw() -> None:
    # The case above, over thirty draws of the same fifth thrown at random: each of them.
    unthrottled = drive(Service(), 60.0, workers=8, latency=0.05, since=30.0)

    kept = [
        drive(Service(random_share=0.2, seed=seed), 60.0, workers=8, latency=0.05, since=30.0).sent / unthrottled.sent
        for seed in range(1, 31)
    ]

    assert min(kept) >= 0.8


@pytest.mark.parametrize(("quota", "workers"), [(3.0, 4), (5.0, 8)])
def test_two_processes_sharing_a_quota_keep_to_it_with_few_throttled_answers(quota: float, workers: int) -> None:
    # Each learns the quota on its own from its share of the answers; together they send as much as it allows.
    tally = drive(Service(quota=quota), 120.0, workers=workers, latency=0.1, since=30.0, learners=2)

    assert tally.throttled <= 0.25 * tally.admitted
    assert tally.admitted >= 0.95 * quota * 90.0


@pytest.mark.parametrize(("workers", "latency"), [(2, 0.5), (3, 0.8), (4, 1.0)])
def test_a_sender_paced_near_the_quota_by_its_own_work_keeps_to_it(workers: int, latency: float) -> None:
    # The backlog's drain: a few messages at a time, each call waiting on the ones before, asks about 4 a second of a
    # quota of 3. Grown while it held nothing back, its limit would be far past the quota, and the throttling would
    # stay under the share that cuts it until it was: the limit grows only while a request waits for its turn.
    tally = drive(Service(quota=3.0), 150.0, workers=workers, latency=latency, since=30.0)

    assert tally.throttled <= 0.25 * tally.admitted
    assert tally.admitted >= 0.95 * 3.0 * 120.0


def test_a_drain_reserving_a_batchs_turns_at_once_grows_towards_the_quota() -> None:
    # The backlog's drain takes ten messages and reserves their calls' turns at once, then none until the next batch,
    # half a second later. Counted in seconds since the last reservation that waited, the limit grew by nothing at the
    # first of a batch (none waits) and by nothing at the others (no time between them): started at two thirds of the
    # quota, it stayed there. The half second between batches is not made up for.
    tally = drain(Service(quota=3.0), 150.0, learners=1, start=2.0, overhead=0.5, since=30.0)

    assert tally.admitted >= 0.9 * 3.0 * 120.0
    assert tally.throttled <= 0.25 * tally.admitted


@pytest.mark.parametrize("draw", range(4))
@pytest.mark.parametrize("quota", [3.0, 5.0, 20.0])
def test_two_drain_environments_keep_to_a_quota_they_learn_apart(quota: float, draw: int) -> None:
    # MaximumConcurrency 2: two environments, each started at half the sender's rate, learn one quota apart from
    # their own answers. Growing by the second, the two grew twice as fast as one, and a few requests a second each
    # outgrew the quota by half before their answers showed it: 0.3-0.4 throttled per admitted call at 3 a second.
    tally = drain(Service(quota=quota), 150.0, learners=2, start=0.9 * quota, since=30.0, draw=draw)

    assert tally.throttled <= 0.25 * tally.admitted
    assert tally.admitted >= 0.95 * quota * 120.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def sent_over(rate: Rate, clock: FakeClock, count: int, seconds: float) -> list[float]:
    """``count`` requests given turns evenly over ``seconds`` (the clock moves on); when each was sent."""
    sent = []
    for _ in range(count):
        turn = rate.reserve(clock.now + 60.0)
        assert turn is not None
        sent.append(max(turn, clock.now))
        clock.now += seconds / count
    return sent


def answered(rate: Rate, clock: FakeClock, sent: list[float], throttled: list[bool]) -> float | None:
    """Answers to those requests, in order, each a millisecond after the last; the last lowered limit, if any."""
    lowered = None
    for when, refused in zip(sent, throttled, strict=True):
        clock.now = max(clock.now, when) + 0.001
        lowered = rate.answered(when, throttled=refused) or lowered
    return lowered


def limited(clock: FakeClock) -> Rate:
    """A rate whose first round passed unthrottled, then limited by a round far over a quota of about 10 a second:
    40 requests in a second, 10 admitted."""
    rate = Rate("kms", clock=clock)
    answered(rate, clock, sent_over(rate, clock, 20, 1.0), [False] * 20)
    sent = sent_over(rate, clock, 40, 1.0)
    assert answered(rate, clock, sent, [index % 4 != 0 for index in range(40)]) is not None
    return rate


def first_burst(clock: FakeClock, rate: Rate, in_flight: int) -> tuple[list[float], float]:
    """11 requests sent over 50 ms, 8 of them answered throttled at once, ``in_flight`` still unanswered: when each
    was sent, and the limit the alarm set."""
    sent = sent_over(rate, clock, 11, 0.05)
    lowered = None
    for when in sent[:8]:
        clock.now += 0.001
        lowered = lowered or rate.answered(when, throttled=True, outstanding=in_flight)
    assert lowered is not None and rate.limit == lowered
    return sent, lowered


def test_a_first_burst_counts_the_quotas_burst_in_what_it_let_through() -> None:
    # 11 requests over 50 ms: the quota's burst let 3 through (still in flight), and 8 came back throttled at once.
    # Counted over the time since, what was let through would say 60 a second; over the time the burst was sent in
    # and the second the quota's burst held, about 3.
    clock = FakeClock()
    rate = Rate("kms", clock=clock)

    sent, lowered = first_burst(clock, rate, in_flight=3)

    assert lowered == pytest.approx(3 / (sent[-1] - sent[0] + 1.0) / (1.0 - Rate.PRIOR - Rate.TARGET))


def test_a_first_burst_counted_as_let_through_is_lowered_by_each_of_it_answered_throttled_after() -> None:
    # The 3 in flight were counted as let through; 2 of them come back throttled after the alarm, the last admitted.
    clock = FakeClock()
    rate = Rate("kms", clock=clock)
    sent, lowered = first_burst(clock, rate, in_flight=3)
    one = lowered / 3
    before = clock.now
    clock.now += 0.01

    late = [rate.answered(when, throttled=refused) for when, refused in zip(sent[8:], [True, True, False], strict=True)]

    assert late[0] == pytest.approx(lowered - one) and late[1] == pytest.approx(lowered - 2 * one)
    assert late[2] is None and rate.limit == pytest.approx(one)  # what the burst let through: 1 in 1.05 s
    assert not rate.current(before)  # turns given at the rate before are given again


def test_a_growth_gives_again_the_turns_given_for_later_at_the_limit_before() -> None:
    # Requests asked four times as fast as the limit: their turns are given for later, spaced for it. When the limit
    # grows, the requests still waiting would go on at the old pace, and the next round would judge the growth on it.
    clock = FakeClock()
    rate = Rate("kms", clock=clock)
    assert rate.seed(4.0)
    reserved, turn = clock.now, None
    while rate.limit == 4.0:  # a round of answers, none throttled
        reserved, turn = clock.now, rate.reserve(clock.now + 60.0)
        clock.now += 1.0 / 16
        rate.answered(clock.now, throttled=False)

    assert rate.limit is not None and rate.limit > 4.0
    assert turn is not None and turn > clock.now + 1.0  # the last turn was given for later, spaced for 4 a second
    assert not rate.current(reserved)  # and is given again
    assert rate.current(clock.now)


def test_a_caller_waiting_for_its_turn_is_woken_when_the_limit_changes() -> None:
    # A turn far ahead, on the real clock: the caller waits for it until the limit changes, then is told to take
    # another (pacing's ``_wait_turn``). Judged by what ``wait`` answered, not by how long it took.
    rate = Rate("kms")
    assert rate.seed(1.0)
    reserved = time.monotonic()
    turns = [rate.reserve(reserved + 60.0) for _ in range(30)]
    turn = turns[-1]
    assert turn is not None and turn > reserved + 20.0  # one a second: the thirtieth half a minute on
    woken: list[bool] = []
    waiter = threading.Thread(target=lambda: woken.append(rate.wait(reserved, turn)))
    waiter.start()

    while waiter.is_alive() and not rate._respaced._waiters:  # type: ignore[attr-defined]
        time.sleep(0.001)  # until it waits
    for _ in range(30):  # a round throttled far over the target: the limit is lowered
        rate.answered(time.monotonic(), throttled=True)
    waiter.join(timeout=60.0)

    assert woken == [False]
    assert rate.wait(time.monotonic(), time.monotonic()) is True  # a turn given since, come: it holds


def test_a_burst_answered_throttled_first_is_not_lowered_while_most_of_it_is_in_flight() -> None:
    clock = FakeClock()
    rate = Rate("kms", clock=clock)
    sent = sent_over(rate, clock, 48, 0.01)

    for when in sent[:8]:
        clock.now += 0.001
        assert rate.answered(when, throttled=True, outstanding=40) is None  # 8 of 48: not surely over the target

    assert rate.limit is None


def test_a_round_far_over_the_target_sets_the_limit_where_a_quota_would_throttle_the_target() -> None:
    clock = FakeClock()

    rate = limited(clock)

    # Lowered at the alarm: what the quota let through a second, over the share of the target let through.
    assert rate.limit is not None and 8.0 <= rate.limit <= 13.0
    now = clock.now
    turns = [rate.reserve(now + 10.0) for _ in range(5)]
    assert all(turn is not None for turn in turns)
    gaps = [b - a for a, b in itertools.pairwise(turns)]  # type: ignore[operator]
    assert gaps == pytest.approx([1.0 / rate.limit] * 4)


def test_a_turn_given_before_the_limit_was_lowered_is_reserved_again() -> None:
    clock = FakeClock()
    rate = Rate("kms", clock=clock)
    answered(rate, clock, sent_over(rate, clock, 20, 1.0), [False] * 20)
    reserved = clock.now

    sent = sent_over(rate, clock, 40, 1.0)
    answered(rate, clock, sent, [index % 4 != 0 for index in range(40)])

    assert rate.limit is not None and not rate.current(reserved)
    assert rate.current(clock.now)


def test_a_limit_that_holds_nothing_back_does_not_grow() -> None:
    clock = FakeClock()
    rate = limited(clock)
    limit = rate.limit
    assert limit is not None

    for _ in range(60):  # a request a second, under the limit: none waits for its turn
        clock.now += 1.0
        assert rate.reserve(clock.now + 10.0) == clock.now
        rate.answered(clock.now, throttled=False)

    assert rate.limit == limit


def test_a_limit_grows_while_requests_wait_and_none_is_throttled_faster_the_longer_it_grows() -> None:
    clock = FakeClock()
    rate = limited(clock)
    limit = rate.limit
    assert limit is not None

    steps = []
    for _ in range(20):  # rounds of requests that wait for their turns, none throttled
        before = rate.limit
        assert before is not None
        sent = sent_over(rate, clock, 25, 25 / (2 * before))  # asked twice as fast as the limit
        answered(rate, clock, sent, [False] * 25)
        assert rate.limit is not None
        steps.append(math.log(rate.limit / before))

    assert rate.limit / limit > 2.0  # past the plateau (the limit before the alarm was none) and on
    assert steps[-1] > steps[len(steps) // 2] > 0.0  # faster the longer it grows


def test_a_limit_grows_no_more_than_step_an_answer() -> None:
    # At a limit of about one a second, a round holds a few answers: the curve, past its plateau, would grow faster
    # than STEP an answer, so that a sender on a shared quota would outgrow it between two looks.
    clock = FakeClock()
    rate = Rate("kms", clock=clock)
    assert rate.seed(1.0)
    steps = []  # (growth in logarithms, answers since the last)
    answers = 0
    while clock.now < 120.0:
        before = rate.limit
        turn = rate.reserve(clock.now + 60.0)
        assert turn is not None and before is not None
        clock.now = max(turn, clock.now) + 0.01  # asked again at once: every turn waits for the limit
        rate.answered(turn, throttled=False)
        answers += 1
        if rate.limit != before:
            assert rate.limit is not None
            steps.append((math.log(rate.limit / before), answers))
            answers = 0

    assert all(0.0 < grown <= Rate.STEP * count + 1e-9 for grown, count in steps)
    assert any(grown == pytest.approx(Rate.STEP * count) for grown, count in steps)  # the bound held it back


def test_a_limit_lowered_a_little_grows_back_towards_where_it_was_and_slows_there() -> None:
    # CUBIC's curve: a round a little over the target lowers the limit part of the way; it grows back to about the
    # limit it was lowered from in the curve's K seconds, faster at first than near it.
    clock = FakeClock()
    rate = Rate("kms", clock=clock)
    assert rate.seed(20.0)
    clock.now += 0.01
    sent = sent_over(rate, clock, 24, 0.6)  # asked at 40 a second: the turns wait for the limit's, 20 a second
    assert answered(rate, clock, sent, [index % 5 == 0 for index in range(24)]) is not None  # a fifth throttled
    lowered, since = rate.limit, clock.now
    assert lowered is not None and lowered < 20.0
    climb = math.cbrt(math.log(20.0 / lowered) / Rate.CUBIC)

    growth = []  # per second, in logarithms, round by round
    while clock.now - since < climb:
        before, started = rate.limit or math.inf, clock.now
        sent = sent_over(rate, clock, 30, 30 / (2 * before))  # asked twice as fast as the limit: the turns wait
        answered(rate, clock, sent, [False] * 30)
        growth.append(math.log((rate.limit or math.inf) / before) / (clock.now - started))

    assert 0.9 * 20.0 <= (rate.limit or math.inf) <= 1.1 * 20.0
    assert growth[0] > 2 * growth[-1] > 0.0  # fast from the lowered limit, slow near the plateau


def test_background_throttling_is_taken_as_such_and_the_limit_put_back() -> None:
    # A fifth thrown at random, no quota: rounds at the rates the decreases went through all throttle a fifth; no quota
    # explains that as well, and the limit is put back where it was before them (none).
    rates: list[Rate] = []

    def law(clock: object) -> Rate:
        rates.append(Rate("s3", clock=clock))  # type: ignore[arg-type]
        return rates[-1]

    drive(Service(random_share=0.2, seed=7), 60.0, workers=8, latency=0.05, law=law)

    assert 0.15 <= rates[0].background <= 0.25
    assert rates[0].limit is None


def test_a_lowered_quota_is_not_taken_for_background() -> None:
    # A quota of 20 a second lowered to 2 at 20 s: the rounds at the lower rates throttle more than those before, which
    # neither background nor one quota does; the fit starts anew, and the limit comes down to the new quota.
    rates: list[Rate] = []

    def law(clock: object) -> Rate:
        rates.append(Rate("kms", clock=clock))  # type: ignore[arg-type]
        return rates[-1]

    tally = drive(Service(quota=20.0, changes=((20.0, 2.0),)), 60.0, workers=8, latency=0.1, since=30.0, law=law)

    assert rates[0].background <= Rate.PRIOR
    assert rates[0].limit is not None and rates[0].limit <= 3.0
    assert tally.throttled <= 0.25 * tally.admitted


@pytest.mark.parametrize(("workers", "latency"), [(14, 0.1), (14, 0.15), (20, 0.1), (20, 0.15)])
def test_a_quota_lowered_in_the_middle_of_a_round_starts_the_fit_anew(workers: int, latency: float) -> None:
    # A quota of 30 a second lowered to 3 at 20 s, in the middle of a round. Its answers before the change were
    # admitted at the old rate, and the rounds after at the new one throttle a share no higher: fitted together, they
    # read as background, and the limit went back to none with throttled bursts after. A surge ends the fit instead.
    rates: list[Rate] = []

    def law(clock: object) -> Rate:
        rates.append(Rate("kms", clock=clock))  # type: ignore[arg-type]
        return rates[-1]

    service = Service(quota=30.0, changes=((20.0, 3.0),))
    tally = drive(service, 40.0, workers=workers, latency=latency, since=22.0, law=law)

    assert rates[0].limit is not None and rates[0].limit <= 1.5 * 3.0
    assert tally.admitted >= 0.8 * 3.0 * 18.0
    assert tally.throttled <= 0.25 * tally.admitted


def test_a_round_surely_over_the_target_with_few_answers_is_lowered_as_far_as_it_is_sure() -> None:
    # A round of a few requests a second ends in time with six answers, four throttled: short of an alarm (too few
    # answers), but nearly as sure. Lowered by a round's damping alone, a limit over a quota at a request a second
    # would take round after round of 3 s, each throttling half, to come down to it.
    clock = FakeClock()
    rate = Rate("kms", clock=clock)
    assert rate.seed(10.0)
    lowered = None
    for refused in (True, False, True, False, True, True):  # a request every half second, answered at once
        clock.now += 0.5
        turn = rate.reserve(clock.now + 60.0)
        assert turn == clock.now
        lowered = rate.answered(turn, throttled=refused) or lowered

    expected = Rate.PRIOR + Rate.TARGET
    sure = evidence(4 / 6, expected, 6) / Rate.ALARM
    assert 0.5 < sure < 1.0  # no alarm, but most of one
    sent = 6 / 3.0  # a round of 3 s, not paced by the limit: the rate it was sent at
    aimed = sent * (1.0 - 4.5 / 7.0) / (1.0 - expected)
    assert lowered == pytest.approx(sent * (aimed / sent) ** sure)
    assert lowered < sent * (aimed / sent) ** (6 / (6 + Rate.DAMPING))  # lower than damping alone would take it


def test_an_alarm_is_held_to_its_odds_and_the_logarithm_of_the_answers_it_is_looked_at_after() -> None:
    # An alarm is looked at after every answer, each look another chance to pass 1,000 to 1: under 20% thrown at random
    # six throttled of twelve pass it now and then, and would set a limit from none at once.
    expected = Rate.PRIOR + Rate.TARGET
    assert Rate.ALARM <= evidence(6 / 12, expected, 12) < Rate.ALARM + math.log(12)
    clock = FakeClock()
    rate = Rate("dynamodb", clock=clock)
    for refused in [False] * 6 + [True] * 6:
        clock.now += 0.1
        turn = rate.reserve(clock.now + 60.0)
        assert turn is not None
        assert rate.answered(turn, throttled=refused) is None
    assert rate.limit is None  # the round goes on, to be judged when it ends

    # Far over a quota, the alarm still comes as soon as a round holds the answers an alarm needs.
    rate = Rate("dynamodb", clock=clock)
    cuts = []
    for _ in range(Rate.MIN_ANSWERS):
        clock.now += 0.01
        turn = rate.reserve(clock.now + 60.0)
        assert turn is not None
        cuts.append(rate.answered(turn, throttled=True))
    assert cuts[:-1] == [None] * (Rate.MIN_ANSWERS - 1)
    assert cuts[-1] is not None and rate.limit == cuts[-1]


def test_a_rate_learnt_elsewhere_is_started_at_and_lowered_from() -> None:
    clock = FakeClock()
    rate = Rate("kms", clock=clock)
    assert rate.seed(8.0) and rate.limit == 8.0  # the deferring worker's learnt rate, for the backlog's drain

    sent = sent_over(rate, clock, 24, 1.0)  # at the limit: the turns wait
    lowered = answered(rate, clock, sent, [index % 2 == 1 for index in range(24)])  # over the quota all the same

    assert lowered is not None and lowered < 8.0


def test_a_rate_that_learnt_its_own_limit_is_not_started_again() -> None:
    clock = FakeClock()
    rate = limited(clock)
    limit = rate.limit

    assert not rate.seed(100.0)
    assert rate.limit == limit


@pytest.mark.parametrize(("pace", "limit"), [(0.001, Rate.FLOOR), (1e9, 1e9), (3.5, 3.5)])
def test_a_rate_learnt_elsewhere_is_taken_within_bounds(pace: float, limit: float) -> None:
    rate = Rate("kms")

    assert rate.seed(pace) and rate.limit == limit


@pytest.mark.parametrize("pace", [math.nan, math.inf, -math.inf])
def test_a_rate_learnt_elsewhere_that_is_no_number_is_not_taken(pace: float) -> None:
    rate = Rate("kms")

    assert not rate.seed(pace) and rate.limit is None


def test_a_surge_after_a_rounds_admitted_answers_ends_it_aimed_from_the_surges_own_answers() -> None:
    # A quota lowered in the middle of a round: its first 30 answers admitted, every one after throttled. Over the whole
    # round the share is far from an alarm when the surge is sure; the limit is aimed from the surge's answers alone.
    clock = FakeClock()
    rate = Rate("kms", clock=clock)
    assert rate.seed(100.0)
    sent = sent_over(rate, clock, 40, 0.2)  # asked at 200 a second: the turns wait for the limit's, 100 a second
    assert answered(rate, clock, sent[:30], [False] * 30) is None

    throttled = 0
    lowered = None
    while lowered is None and throttled < 10:
        lowered = answered(rate, clock, [sent[30 + throttled]], [True])
        throttled += 1

    expected = Rate.PRIOR + Rate.TARGET
    assert lowered is not None and throttled <= 6
    assert evidence(throttled / (30 + throttled), expected, 30 + throttled) < Rate.ALARM / 4  # the round: no alarm
    assert lowered == pytest.approx(100.0 * (1.0 - (throttled + 0.5) / (throttled + 1.0)) / (1.0 - expected))


def fifth_throttled_rounds(rate: Rate, clock: FakeClock, rounds: int) -> None:
    """``rounds`` rounds of 25 answers over 1.25 s, a fifth of them throttled, spread out."""
    for _ in range(rounds):
        answered(rate, clock, sent_over(rate, clock, 25, 1.25), [index % 5 == 0 for index in range(25)])


@pytest.mark.parametrize("fitted", [0, Rate.FIT_ROUNDS])
def test_a_run_of_throttled_answers_is_a_surge_only_over_the_share_the_fitted_rounds_throw(fitted: int) -> None:
    # Five throttled answers in a row: a surge over the target's share, not over a fifth thrown at random all along.
    clock = FakeClock()
    rate = Rate("s3", clock=clock)
    assert rate.seed(100.0)
    fifth_throttled_rounds(rate, clock, fitted)
    limit = rate.limit

    lowered = answered(rate, clock, sent_over(rate, clock, 15, 0.1), [False] * 10 + [True] * 5)

    assert (lowered is None and rate.limit == limit) if fitted else (lowered is not None and lowered < 0.5 * limit)


@pytest.mark.parametrize("thrown", [False, True])
def test_a_run_of_throttled_answers_is_an_alarm_only_over_the_share_the_fitted_rounds_throw(thrown: bool) -> None:
    # Six throttled answers of eight, with no limit: far over the target's share after rounds that threw none, not
    # over a fifth thrown at random all along (S3's SlowDown under load answers before the requests it admits).
    clock = FakeClock()
    rate = Rate("s3", clock=clock)
    for _ in range(Rate.FIT_ROUNDS):
        answered(rate, clock, sent_over(rate, clock, 25, 1.25), [thrown and index % 5 == 0 for index in range(25)])
    assert rate.limit is None

    lowered = answered(rate, clock, sent_over(rate, clock, 8, 0.1), [False] * 2 + [True] * 6)

    assert (lowered is None and rate.limit is None) if thrown else lowered is not None


def test_one_round_far_over_the_target_is_no_measure_of_the_usual_share() -> None:
    # A quota lowered: a round three fifths throttled, then a run of throttled answers. The fitted rounds hold that
    # round alone, which says what changed, not what is usual: the run is an alarm, lowered again at once.
    clock = FakeClock()
    rate = Rate("kms", clock=clock)
    assert rate.seed(100.0)
    first = answered(rate, clock, sent_over(rate, clock, 25, 0.25), [index % 5 < 3 for index in range(25)])
    assert first is not None

    lowered = answered(rate, clock, sent_over(rate, clock, 8, 0.1), [False] * 2 + [True] * 6)

    assert lowered is not None and lowered < first


def test_an_alarm_right_after_a_background_verdict_puts_the_background_back() -> None:
    # A fifth throttled at every rate the limit went down through: background, and the limit put back where it was
    # (none: it was seeded). The round after it floods a quota the sender shares, whose other senders' moves it does
    # not see: that was no background.
    clock = FakeClock()
    rate = Rate("kms", clock=clock)
    assert rate.seed(100.0)
    for _ in range(4):  # rounds of a little over a second at the limit, each lowering it
        count = math.ceil(1.2 * (rate.limit or math.inf))
        answered(rate, clock, sent_over(rate, clock, count, 0.0), [index % 5 == 0 for index in range(count)])
    assert 0.15 <= rate.background <= 0.25 and rate.limit is None

    lowered = answered(rate, clock, sent_over(rate, clock, 30, 0.06), [True] * 30)

    assert lowered is not None and rate.background == Rate.PRIOR
