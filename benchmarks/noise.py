"""Pacing under scattered throttling, as ratios: a batch under random throttling answers (no quota anywhere), and the
clean batch after it, each against a clean batch before, in the same run.

Three batches of the same size, through the real worker's Lambda handler on moto behind the fault proxy, kept warm
between them with one runtime (its learnt rates carry over, as in one Lambda environment), each delivered as the event
source mapping does until every record is clean. During the middle batch, ``--share`` of every request (KMS, S3,
DynamoDB, the Management API) is answered "throttled" at random. A pacing law that reads that noise as a quota slows the
noisy batch down, and, if it keeps what it read, every batch after it.

Targets: the noisy batch within 2x of the clean one; the clean one after it within 1.5x.

    python -m benchmarks.noise                      # 300 sessions a batch, a fifth answered "throttled"
    python -m benchmarks.noise --sessions 100 --share 0.1
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass

from benchmarks.quota import proxied_world
from cleanup.telemetry import LOGGER_NAME
from tests.scenarios.helpers import deliver_like_lambda, new_ids
from tests.stack import shared_client
from worker.local.backend import LocalAws
from worker.local.gateway import LocalGateway

TARGET_NOISY = 2.0  # the noisy batch's time, as a multiple of the clean one's, at most
TARGET_AFTER = 1.5  # the clean batch after it, likewise
TARGET_SESSIONS = 300  # the targets are stated for batches of this many sessions


@dataclass(frozen=True)
class Timed:
    """One batch: how long its delivery took until clean, and what the pacer had learnt at its end."""

    case: str
    sessions: int
    share: float  # of requests answered "throttled" at random
    seconds: float
    invocations: int
    clean: bool
    limits: dict[str, float]  # requests a second, by gate, of the gates that had one


def measure(sessions: int, share: float) -> list[Timed]:
    """The three batches, on one stack, through one warm runtime."""
    logging.getLogger(LOGGER_NAME).addHandler(logging.NullHandler())
    logging.getLogger(LOGGER_NAME).propagate = False
    with LocalAws() as aws, LocalGateway() as gateway, ExitStack() as proxies:
        aws.use()
        shared_client.cache_clear()  # a server of its own: clients made for another one (section 9's) are made again
        world = proxied_world(aws, gateway, "noise", proxies)
        plan = world.plan
        plan.kinds = ("throttle",)  # throttling answers only, when the rate is set
        runtime = world.runtime()
        invoke = world.invoker(runtime)
        timed = []
        for case, rate in (("clean", 0.0), ("noisy", share), ("clean, after the noise", 0.0)):
            ended = world.make_sessions(new_ids(sessions, "noise"), sockets=min(10, sessions), objects=1)
            world.end(ended)
            records = world.records()
            plan.rate = rate
            started = time.perf_counter()
            delivery = deliver_like_lambda(records, invoke)
            seconds = time.perf_counter() - started
            plan.rate = 0.0
            grants = world.stack.grant_ids()
            clean = not any(made.grant_id in grants for made in ended)  # every grant retired, in the end
            limits = runtime.clients.pacer.learnt()
            timed.append(Timed(case, sessions, rate, seconds, delivery.invocations, clean, limits))
        return timed


def table(results: list[Timed]) -> list[str]:
    """The Markdown rows, the ratios to the clean batch, and the targets."""
    clean = results[0].seconds
    lines = [
        "| batch | sessions | answered throttled at random | seconds | x the clean batch | invocations | limits "
        "learnt at its end (/s) | clean |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for batch in results:
        limits = ", ".join(f"{gate} {limit:g}" for gate, limit in sorted(batch.limits.items())) or "none"
        lines.append(
            f"| {batch.case} | {batch.sessions} | {batch.share:.0%} | {batch.seconds:.1f} | "
            f"{batch.seconds / clean:.2f} | {batch.invocations} | {limits} | {'yes' if batch.clean else 'NO'} |"
        )
    noisy, after = (batch.seconds / clean for batch in results[1:])
    met = noisy <= TARGET_NOISY and after <= TARGET_AFTER and all(batch.clean for batch in results)
    verdict = "met" if met else "NOT met"
    if results[0].sessions < TARGET_SESSIONS:
        verdict += f" (the targets are stated for {TARGET_SESSIONS} sessions a batch: at this size, for information)"
    lines.append(
        f"\ntargets: the noisy batch <= {TARGET_NOISY:g}x the clean one, the clean one after <= {TARGET_AFTER:g}x, "
        f"clean: {verdict}"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=TARGET_SESSIONS, help="sessions a batch")
    parser.add_argument("--share", type=float, default=0.2, help="share of requests answered throttled at random")
    args = parser.parse_args(argv)
    results = measure(args.sessions, args.share)
    print("\n".join(table(results)))
    return 0 if all(batch.clean for batch in results) else 1


if __name__ == "__main__":
    sys.exit(main())
