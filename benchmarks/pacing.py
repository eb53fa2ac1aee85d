"""The pacing model: laws run on seeded draws of a simulated service, and the draws that meet each target counted.

Each case is run on ``--draws`` seeded draws (the quota, the callers, their latency and the noise are drawn), on the
simulation's own clock (``tests.pace_sim``): the same draws give the same table, however loaded the machine. Every
law in ``LAWS`` runs on the same draws, side by side. Two shapes of demand:

* **continuous**: callers each sending one request at a time, at the turns the law gives (``pace_sim.drive``);
* **bursty**: batches of 1 to 100 calls at once, every call's turn reserved together, a throttled call tried again
  after a back-off, throttling answers coming back sooner than admitted ones (``pace_sim.drain``).

The cases and their targets:

| case | measure | target |
|---|---|---|
| random throttling at 5, 10, 20% | throughput against the same demand unpaced | every draw >= 0.8 |
| the same, from 20 s on (after a clean start) | the same, from then on | every draw >= 0.8 |
| the same at 1-10 requests a second, for 120 s (from the start; from 20 s on) | the same | every draw >= 0.8 |
| one sender at a quota | admitted share of the quota; throttled per admitted | >= 0.95; <= 0.15 |
| a 40 s batch at 3 or 5/s | the same, from its first request | >= 0.95; <= 0.15 |
| 2, 3, 4 senders on one quota | admitted together; throttled per admitted | >= 0.95; <= 0.25 |
| a quota raised 10x | seconds until a second admits 0.9 of the new quota | <= 30 |
| a quota lowered 10x | seconds of 0.1 s bins more throttled than admitted, in the 10 s after | <= 1 |

Throughput under random throttling is the calls admitted, against the same callers and the same noise unpaced: 1.0
is pacing that cost nothing (a throttled answer is back in 5 ms, so unpaced callers lose little to it; in the bursty
shape, a throttled call's retry after its back-off is the work's own cost whatever the law). A bursty sender's share
of a quota is of what its demand could use: the lower of the quota and what the same batches admit unthrottled and
unpaced. Steady cases are counted from 10 s to 60 s; random throttling that begins at 20 s, from then on.

    python -m benchmarks.pacing                 # 100 draws a case, on every core
    python -m benchmarks.pacing --draws 10 --jobs 1
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial

from benchmarks.pacing_before import JudgedRate
from tests.pace_sim import Law, LawFactory, Service, Tally, Unpaced, drain, drive, learnt


def previous(clock: Callable[[], float]) -> Law:
    """The law before (``benchmarks.pacing_before``), for the side-by-side table."""
    return JudgedRate("kms", clock=clock)


LAWS: dict[str, LawFactory] = {"this law (cleanup.aws.rate)": learnt, "the law before": previous}
"""The laws compared, by name: each runs on the same draws."""

SECONDS = 60.0  # a steady case runs this long
SINCE = 10.0  # and is counted from here
CHANGE_AT = 20.0  # a quota raised or lowered here, or random throttling begun after a clean start
BIN = 0.1  # seconds: the bins a lowered quota's throttled bursts are counted in
BURST_WINDOW = 10.0  # and over how long after the change
BURSTY_BATCH = (1, 100)  # calls at once, bursty demand
NOISE = (0.05, 0.10, 0.20)
SLOW_WORKERS = (1, 3)  # callers, each one request at a time: with SLOW_LATENCY, 1 to 10 requests a second
SLOW_LATENCY = (0.3, 1.0)  # seconds
SLOW_SECONDS = 120.0  # a slow case runs this long: a limit lowered round after round takes minutes to crawl


@dataclass(frozen=True)
class Target:
    """One measure of a case and its bound: ``at_least`` or at most ``bound``."""

    measure: str
    bound: float
    at_least: bool

    def met(self, value: float) -> bool:
        return value >= self.bound if self.at_least else value <= self.bound

    def __str__(self) -> str:
        return f"{self.measure} {'>=' if self.at_least else '<='} {self.bound:g}"


@dataclass(frozen=True)
class Case:
    """A case of the model: ``run(law, draw)`` gives one value a target, in order."""

    name: str
    shape: str
    targets: tuple[Target, ...]
    run: Callable[[LawFactory, int], tuple[float, ...]]


KEPT = (Target("kept", 0.8, at_least=True),)
ONE = (Target("share", 0.95, at_least=True), Target("throttled/admitted", 0.15, at_least=False))
SHARED = (Target("share", 0.95, at_least=True), Target("throttled/admitted", 0.25, at_least=False))
FOUND = (Target("seconds", 30.0, at_least=False),)
BURSTS = (Target("seconds", 1.0, at_least=False),)


def draws(draw: int, salt: str) -> random.Random:
    """The draw's own random numbers for a case: the same whatever else runs."""
    return random.Random(f"{salt}:{draw}")


def log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def callers(rng: random.Random, rate: float, latency: float, least: int = 2) -> int:
    """Enough callers to ask 2 to 6 times ``rate``, each one request at a time."""
    return max(least, math.ceil(rate * latency * rng.uniform(2.0, 6.0)))


def share_and_throttled(tally: Tally, allowed: float) -> tuple[float, float]:
    """The admitted share of ``allowed`` calls, and throttled answers per admitted call."""
    return tally.admitted / allowed, tally.throttled / max(tally.admitted, 1)


# Continuous demand.
def noise(share: float, law: LawFactory, draw: int, begins: float = 0.0) -> tuple[float, ...]:
    """Random throttling from ``begins`` on (after a clean start, the rounds fitted before it throttled none),
    counted from then or from SINCE, whichever is later."""
    rng = draws(draw, f"late{share}" if begins else f"noise{share}")
    workers, latency = rng.randint(2, 8), rng.uniform(0.05, 0.3)
    return _kept(share, law, draw, workers, latency, SECONDS, begins)


def slow_noise(share: float, law: LawFactory, draw: int, begins: float = 0.0) -> tuple[float, ...]:
    """Random throttling of a few requests a second: rounds end in time with few answers. From ``begins`` on, as in
    ``noise``: the first noisy round's alarm finds no usual share to be judged over (the noise benchmark's crawl)."""
    workers, latency = slow_callers(share, draw)
    return _kept(share, law, draw, workers, latency, SLOW_SECONDS, begins)


def slow_callers(share: float, draw: int) -> tuple[int, float]:
    """The callers of ``slow_noise``'s draw, and the latency of their answers."""
    rng = draws(draw, f"slow{share}")
    return rng.randint(*SLOW_WORKERS), rng.uniform(*SLOW_LATENCY)


def _kept(
    share: float, law: LawFactory, draw: int, workers: int, latency: float, seconds: float, begins: float = 0.0
) -> tuple[float, ...]:
    """Calls admitted under ``law`` against the same callers and noise unpaced."""
    run = partial(drive, seconds=seconds, workers=workers, latency=latency, since=max(SINCE, begins))
    service = partial(Service, random_share=share, seed=draw, noise_since=begins)
    return (run(service(), law=law).admitted / run(service(), law=Unpaced).admitted,)


def one_sender(law: LawFactory, draw: int) -> tuple[float, ...]:
    rng = draws(draw, "one")
    quota, latency = log_uniform(rng, 2.0, 50.0), rng.uniform(0.02, 0.3)
    tally = drive(
        Service(quota=quota), SECONDS, workers=callers(rng, quota, latency), latency=latency, since=SINCE, law=law
    )
    return share_and_throttled(tally, quota * (SECONDS - SINCE))


def short_batch(law: LawFactory, draw: int) -> tuple[float, ...]:
    rng = draws(draw, "batch")
    quota, latency, seconds = rng.choice((3.0, 5.0)), rng.uniform(0.02, 0.3), 40.0
    tally = drive(Service(quota=quota), seconds, workers=callers(rng, quota, latency, 4), latency=latency, law=law)
    return share_and_throttled(tally, quota * seconds)


def shared(senders: int, law: LawFactory, draw: int) -> tuple[float, ...]:
    rng = draws(draw, f"shared{senders}")
    quota, latency = log_uniform(rng, 2.0, 50.0), rng.uniform(0.02, 0.3)
    workers = callers(rng, quota, latency, 2 * senders)
    tally = drive(
        Service(quota=quota), SECONDS, workers=workers, latency=latency, since=SINCE, learners=senders, law=law
    )
    return share_and_throttled(tally, quota * (SECONDS - SINCE))


def raised(law: LawFactory, draw: int) -> tuple[float, ...]:
    rng = draws(draw, "raised")
    quota, latency = log_uniform(rng, 1.0, 20.0), rng.uniform(0.02, 0.2)
    service = Service(quota=quota, changes=((CHANGE_AT, 10 * quota),))
    tally = drive(
        service, SECONDS, workers=callers(rng, 10 * quota, latency), latency=latency, since=CHANGE_AT, law=law
    )
    return (found_after(tally, 0.9 * 10 * quota),)


def lowered(law: LawFactory, draw: int) -> tuple[float, ...]:
    rng = draws(draw, "lowered")
    quota, latency = log_uniform(rng, 5.0, 50.0), rng.uniform(0.02, 0.2)
    service = Service(quota=quota, changes=((CHANGE_AT, quota / 10),))
    tally = drive(service, CHANGE_AT + BURST_WINDOW, workers=callers(rng, quota, latency), latency=latency, law=law)
    return (throttled_bursts(tally, CHANGE_AT),)


def found_after(tally: Tally, rate: float) -> float:
    """Seconds from ``tally.since`` to the end of the first second admitting ``rate`` calls; inf if none did."""
    admitted = [when for when, throttled in tally.answers if not throttled]
    first = 0
    for last, when in enumerate(admitted):
        while admitted[first] <= when - 1.0:
            first += 1
        if last - first + 1 >= rate and when >= tally.since + 1.0:
            return when - tally.since
    return math.inf


def throttled_bursts(tally: Tally, since: float) -> float:
    """Seconds of BIN-long bins, over BURST_WINDOW after ``since``, with more throttled answers than admitted ones."""
    balance: dict[int, int] = {}
    for when, throttled in tally.answers:
        if since <= when < since + BURST_WINDOW:
            key = int((when - since) / BIN)
            balance[key] = balance.get(key, 0) + (1 if throttled else -1)
    return BIN * sum(1 for net in balance.values() if net > 0)


# Bursty demand: batches of calls at once (the backlog's drain, a Lambda batch's fan-out).
def bursty(learners: int, service: Service, law: LawFactory, draw: int, since: float = SINCE) -> Tally:
    return drain(service, SECONDS, learners=learners, start=None, batch=BURSTY_BATCH, since=since, draw=draw, law=law)


def bursty_noise(share: float, law: LawFactory, draw: int, begins: float = 0.0) -> tuple[float, ...]:
    """As ``noise``, in batches."""
    service = partial(Service, random_share=share, seed=draw, noise_since=begins)
    since = max(SINCE, begins)
    return (bursty(1, service(), law, draw, since).admitted / bursty(1, service(), Unpaced, draw, since).admitted,)


def bursty_quota(senders: int, law: LawFactory, draw: int) -> tuple[float, ...]:
    quota = log_uniform(draws(draw, f"bursty{senders}"), 2.0, 50.0)
    demand = bursty(senders, Service(), Unpaced, draw).admitted
    tally = bursty(senders, Service(quota=quota), law, draw)
    return share_and_throttled(tally, min(quota * (SECONDS - SINCE), demand))


CASES = (
    *(Case(f"random throttling {share:.0%}", "continuous", KEPT, partial(noise, share)) for share in NOISE),
    *(
        Case(f"random throttling {share:.0%} from 20 s", "continuous", KEPT, partial(noise, share, begins=CHANGE_AT))
        for share in NOISE
    ),
    *(
        Case(f"random throttling {share:.0%} at 1-10/s", "continuous", KEPT, partial(slow_noise, share))
        for share in NOISE
    ),
    *(
        Case(
            f"random throttling {share:.0%} from 20 s at 1-10/s",
            "continuous",
            KEPT,
            partial(slow_noise, share, begins=CHANGE_AT),
        )
        for share in NOISE
    ),
    Case("one sender at a quota", "continuous", ONE, one_sender),
    Case("a 40 s batch at 3 or 5/s", "continuous", ONE, short_batch),
    *(Case(f"{n} senders on one quota", "continuous", SHARED, partial(shared, n)) for n in (2, 3, 4)),
    Case("a quota raised 10x", "continuous", FOUND, raised),
    Case("a quota lowered 10x", "continuous", BURSTS, lowered),
    *(Case(f"random throttling {share:.0%}", "bursty", KEPT, partial(bursty_noise, share)) for share in NOISE),
    *(
        Case(f"random throttling {share:.0%} from 20 s", "bursty", KEPT, partial(bursty_noise, share, begins=CHANGE_AT))
        for share in NOISE
    ),
    Case("one sender at a quota", "bursty", ONE, partial(bursty_quota, 1)),
    *(Case(f"{n} senders on one quota", "bursty", SHARED, partial(bursty_quota, n)) for n in (2, 3, 4)),
)


Results = dict[tuple[int, str], list[tuple[float, ...]]]
"""Each draw's values (one a target), by (case index, law name)."""


def run_case(case: int, law: str, draw: int) -> tuple[float, ...]:
    """One draw of one case under one law (by index and name: a worker process looks them up)."""
    return CASES[case].run(LAWS[law], draw)


def measure(draw_count: int, jobs: int | None) -> Results:
    """Every case under every law on draws 0..draw_count-1: the values of each draw, by (case, law)."""
    keys = [(case, law) for case in range(len(CASES)) for law in LAWS]
    tasks = [(case, law, draw) for case, law in keys for draw in range(draw_count)]
    with ProcessPoolExecutor(jobs) as pool:
        values = list(pool.map(run_case, *zip(*tasks, strict=True), chunksize=4))
    by_key: Results = {key: [] for key in keys}
    for (case, law, _), value in zip(tasks, values, strict=True):
        by_key[(case, law)].append(value)
    return by_key


def worst(target: Target, values: list[float]) -> float:
    return min(values) if target.at_least else max(values)


def judged(results: Results) -> Iterator[tuple[Case, Target, str, list[float], int]]:
    """Each case, target and law in the table's order: the draws' values and how many met the target."""
    for index, case in enumerate(CASES):
        for position, target in enumerate(case.targets):
            for law in LAWS:
                values = [value[position] for value in results[(index, law)]]
                yield case, target, law, values, sum(target.met(value) for value in values)


def table(results: Results) -> Iterator[str]:
    """A row a case, target and law: the worst draw, the median, and how many draws met the target."""
    yield "| case | shape | target | law | worst draw | median | draws meeting it | met |"
    yield "|---|---|---|---|---:|---:|---:|---|"
    for case, target, law, values, meeting in judged(results):
        yield (
            f"| {case.name} | {case.shape} | {target} | {law} | {worst(target, values):.2f} "
            f"| {statistics.median(values):.2f} | {meeting}/{len(values)} "
            f"| {'yes' if meeting == len(values) else 'no'} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pacing", description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=100, help="seeded draws of each case (default 100)")
    parser.add_argument("--jobs", type=int, default=None, help="processes (default: one a core)")
    arguments = parser.parse_args(argv)
    started = time.perf_counter()
    results = measure(arguments.draws, arguments.jobs)
    print(f"## The pacing model: {arguments.draws} draws a case\n")
    print("\n".join(table(results)))
    verdicts = [meeting == len(values) for *_, values, meeting in judged(results)]
    print(f"\n{sum(verdicts)} of {len(verdicts)} targets met, in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
