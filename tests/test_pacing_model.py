"""The pacing model's benchmark (``benchmarks.pacing``): its measures read a run as stated, its service changes its
quota when told, and the command prints a row for every case, target and law."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.pacing import (
    CASES,
    CHANGE_AT,
    LAWS,
    Target,
    found_after,
    noise,
    one_sender,
    slow_callers,
    throttled_bursts,
)
from cleanup.aws.rate import Rate
from tests.pace_sim import Service, Tally, Unpaced, drive, learnt

ROOT = Path(__file__).resolve().parent.parent


def test_a_quota_changed_mid_run_throttles_at_the_new_quota() -> None:
    service = Service(quota=10.0, changes=((5.0, 1.0),))
    before = [service.throttles(n * 0.2) for n in range(25)]  # 5 a second under 10 a second: none throttled
    after = [service.throttles(5.0 + n * 0.2) for n in range(50)]  # 5 a second over 1 a second

    assert not any(before)
    assert 35 <= sum(after) <= 42  # 10 s at 1 a second admits 10 of 50 (and the bucket's second)


def test_random_throttling_begins_when_told() -> None:
    service = Service(random_share=0.5, seed=3, noise_since=5.0)
    before = [service.throttles(n * 0.01) for n in range(500)]
    after = [service.throttles(5.0 + n * 0.01) for n in range(500)]

    assert not any(before)
    assert 200 <= sum(after) <= 300  # half, drawn


def test_the_slow_noise_from_20_s_throttles_nothing_before_then() -> None:
    # The rows "from 20 s at 1-10/s" start clean, as the noise benchmark's noisy batch follows a clean one: the rounds
    # fitted before the noise threw nothing.
    answers: list[tuple[float, bool]] = []

    class Recorded(Rate):
        def answered(self, sent: float, *, throttled: bool, outstanding: int = 0) -> float | None:
            answers.append((self._clock(), throttled))
            return super().answered(sent, throttled=throttled, outstanding=outstanding)

    (case,) = [case for case in CASES if case.name == "random throttling 20% from 20 s at 1-10/s"]
    case.run(lambda clock: Recorded("kms", clock=clock), 0)

    assert any(when < CHANGE_AT for when, _ in answers)
    assert not any(throttled for when, throttled in answers if when < CHANGE_AT)
    assert any(throttled for when, throttled in answers if when >= CHANGE_AT)


@pytest.mark.parametrize("draw", range(5))
def test_the_slow_noise_callers_ask_a_few_requests_a_second(draw: int) -> None:
    workers, latency = slow_callers(0.2, draw)
    tally = drive(Service(), 20.0, workers=workers, latency=latency, law=Unpaced)

    assert 1.0 * 20.0 <= tally.sent <= 10.0 * 20.0 + workers


def test_unpaced_callers_send_at_every_turn() -> None:
    tally = drive(Service(), 10.0, workers=4, latency=0.1, law=Unpaced)

    assert 396 <= tally.sent <= 404  # 4 callers, one request each 0.1 s
    assert tally.admitted == len(tally.answers)


def test_a_raised_quota_is_found_at_the_end_of_the_first_second_admitting_its_rate() -> None:
    tally = Tally(since=20.0)
    tally.answers = [(20.0 + n / 2, False) for n in range(20)]  # 2 a second for 10 s
    tally.answers += [(30.0 + n / 10, False) for n in range(50)]  # then 10 a second

    assert found_after(tally, 9.0) == pytest.approx(10.8)  # 9 admitted over (29.8, 30.8]
    assert found_after(tally, 20.0) == math.inf


def test_throttled_bursts_count_the_bins_more_throttled_than_admitted_after_the_change() -> None:
    tally = Tally(since=0.0)
    tally.answers = [(4.95, True)] * 5  # before the change: not counted
    tally.answers += [(5.01, True), (5.02, True), (5.03, False)]  # bin 0: more throttled
    tally.answers += [(5.11, True), (5.12, False)]  # bin 1: even
    tally.answers += [(5.55, True)]  # bin 5: more throttled

    assert throttled_bursts(tally, 5.0) == pytest.approx(0.2)


def test_targets_are_met_at_their_bounds() -> None:
    assert Target("share", 0.95, at_least=True).met(0.95) and not Target("share", 0.95, at_least=True).met(0.94)
    assert Target("s", 1.0, at_least=False).met(1.0) and not Target("s", 1.0, at_least=False).met(1.01)


@pytest.mark.timeout(120)
def test_the_benchmark_prints_a_row_for_every_case_target_and_law() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks", "run", "pacing", "--draws", "1", "--jobs", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
    )

    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == sum(len(case.targets) for case in CASES) * len(LAWS)
    for case in CASES:
        assert any(f"| {case.name} | {case.shape} |" in row for row in rows), case.name
    assert all(row.endswith(("| 1/1 | yes |", "| 0/1 | no |")) for row in rows)
    assert "targets met, in" in run.stdout


def test_the_law_keeps_a_lone_quota_at_its_target() -> None:
    # A quota of 2-50 a second asked 2-6 times its rate (the model's case, its first draws): kept full, with a few
    # throttled answers, where a share over the target lowers the limit.
    for draw in range(3):
        share, throttled = one_sender(learnt, draw)

        assert share >= 0.95, draw
        assert throttled <= 0.15, draw


def test_the_law_takes_scattered_throttling_for_background() -> None:
    # A tenth thrown at random, no quota (the model's case, its first draws): no quota explains the answers as well as
    # the same share at every rate, and the limit is put back where it was (1.0: pacing cost nothing).
    kept = [noise(0.1, learnt, draw)[0] for draw in range(3)]

    assert min(kept) >= 0.8, kept
