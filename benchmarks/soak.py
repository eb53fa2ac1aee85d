"""Soak: waves of N sessions for M minutes through the Lambda handler, with faults at the wire; residue must be zero.

Each wave makes N sessions (one in ten with a real socket, capped at 50), ends them (half by TTL), delivers the stream
as Lambda does (redelivering from the lowest failed record) and then looks for anything left of them: objects,
grants, open sockets. Live sessions and sentinel objects made at the start must be untouched at the end.

    python -m benchmarks.soak --sessions 200 --minutes 1 --fault-rate 0.2
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import Counter

from cleanup.telemetry import LOGGER_NAME
from tests.proxy import FaultPlan, FaultProxy
from tests.scenarios.helpers import HTTP_TIMEOUT, Delivery, Made, World, deliver_like_lambda, new_ids
from tests.stack import SessionStack
from worker.local.backend import LocalAws
from worker.local.gateway import LocalGateway


def residue(world: World, ended: list[Made]) -> Counter[str]:
    """What is left of ended sessions: objects, grants, open sockets."""
    objects = set(world.stack.objects("sessions/"))
    grants = world.stack.grant_ids()
    left: Counter[str] = Counter(objects=0, grants=0, sockets=0, sessions=0)
    for made in ended:
        objects_left = sum(key in objects for key in made.objects)
        grant_left = made.grant_id in grants
        socket_left = made.socket is not None and not made.socket.wait_closed(2.0)
        left.update(objects=objects_left, grants=int(grant_left), sockets=int(socket_left))
        left["sessions"] += int(bool(objects_left or grant_left or socket_left))
    return left


def intact(world: World, live: list[Made], kept: set[str]) -> bool:
    """Whether every live session still has all its objects, its grant and an open socket, and every sentinel stays."""
    objects = set(world.stack.objects())
    grants = world.stack.grant_ids()
    return (
        all(key in objects for made in live for key in made.objects)
        and kept <= objects
        and all(made.grant_id in grants for made in live)
        and all(made.socket is None or not made.socket.closed for made in live)
    )


def soak(world: World, sessions: int, minutes: float) -> dict[str, object]:
    live = world.make_sessions(new_ids(10, "live"), sockets=2)
    kept = world.plant_sentinels()
    runtime = world.runtime()
    invoke = world.invoker(runtime)
    delivery, left, waves, cleaned, records = Delivery(), residue(world, []), 0, 0, 0
    stop = time.monotonic() + minutes * 60
    while time.monotonic() < stop:
        ended = world.make_sessions(new_ids(sessions, f"w{waves}"), sockets=min(sessions // 10, 50))
        world.end(ended)
        batch = world.records()
        deliver_like_lambda(batch, invoke, delivery=delivery, max_invocations=10**6)
        left.update(residue(world, ended))
        waves, cleaned, records = waves + 1, cleaned + len(ended), records + len(batch)
    untouched = intact(world, live, kept)
    runtime.close()
    return {
        "waves": waves,
        "sessions cleaned": cleaned - left["sessions"],
        "records delivered": records,
        "invocations": delivery.invocations,
        "failures reported": delivery.reported,
        "records redelivered": delivery.redelivered,
        "requests": sum(world.plan.requests.values()),
        "faults injected": dict(world.plan.injected),
        "retries (worker)": world.sink.totals["Retries"],
        "residue": {name: left[name] for name in ("objects", "grants", "sockets")},
        "records lost (sessions with residue)": left["sessions"],
        "live and sentinels untouched": untouched,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200, help="sessions per wave")
    parser.add_argument("--minutes", type=float, default=1.0, help="how long to keep starting waves")
    parser.add_argument("--fault-rate", type=float, default=0.2, help="share of the worker's requests faulted")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    logging.getLogger(LOGGER_NAME).addHandler(logging.NullHandler())  # the figures, not a line per record
    logging.getLogger(LOGGER_NAME).propagate = False
    plan = FaultPlan(rate=args.fault_rate, seed=args.seed, delay_seconds=HTTP_TIMEOUT + 0.3)
    with LocalAws() as aws, LocalGateway() as gateway:
        aws.use()
        with FaultProxy(aws.endpoint_url, plan) as aws_proxy, FaultProxy(gateway.callback_url, plan) as gw_proxy:
            world = World(SessionStack.create(aws, "soak"), gateway, plan, aws_proxy, gw_proxy)
            started = time.monotonic()
            figures = soak(world, args.sessions, args.minutes)
    print(f"soak: {args.sessions} sessions a wave, fault rate {args.fault_rate}, {time.monotonic() - started:.0f} s")
    for name, value in figures.items():
        print(f"  {name}: {value}")
    left = figures["residue"]
    clean = isinstance(left, dict) and not any(left.values()) and figures["live and sentinels untouched"] is True
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
