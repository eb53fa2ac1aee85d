"""A mass expiry, scaled down, through the real worker on moto: measured next to the capacity model's prediction.

N sessions (a socket for some, a grant and a scratch object each) end at once; the fault proxy enforces a RetireGrant
quota; the stream's records go to ``worker.lambda_handler.handler`` through a simulated event source mapping
(``benchmarks.mapping``), with MaximumRecordAgeInSeconds scaled down as the quota is. Printed: how long the shard
took to be through, how many records went to the on-failure queue, what was left of the sessions, and the model's
figures for the same parameters.

    python -m benchmarks.mass_expiry                     # calibration: the worker as it is, records discarded by age
    python -m benchmarks.mass_expiry --backlog           # lossless: quota-bound work deferred to the backlog queue
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from benchmarks.capacity import Backlog, Expiry, Mapping, Quotas, Result, Worker, simulate
from benchmarks.mapping import Delivered, MappingSettings, deliver, drain_queue, on_failure_message
from cleanup.deadline import Deadline
from cleanup.runtime import Runtime
from cleanup.telemetry import LOGGER_NAME
from tests.proxy import FaultPlan, FaultProxy
from tests.scenarios.helpers import HTTP_TIMEOUT, Made, World, new_ids
from tests.stack import SessionStack, shared_client
from worker import backlog as backlog_handler
from worker import lambda_handler
from worker.local.backend import LocalAws
from worker.local.gateway import LocalGateway

# The worker's pace on this machine against moto (a full core, moto's ~500 calls a second for ~3 calls a session).
HARNESS_WORKER = Worker(memory_mb=1769, cpu_seconds=0.006, overhead=0.05)


CALIBRATION = MappingSettings(batch_size=100, timeout=8.0, retry_attempts=-1, record_age=45.0)
QUOTA_WAIT = 0.1  # QUOTA_WAIT_SECONDS of the stream's worker with a backlog


@dataclass(frozen=True)
class Run:
    """One scaled run's parameters."""

    sessions: int = 600
    sockets: int = 20
    quota: float = 10.0
    mapping: MappingSettings = CALIBRATION
    backlog: bool = False
    drain_concurrency: int = 2
    drain_timeout: float | None = None  # the drain function's timeout; None: the stream's (``mapping.timeout``)

    def model(self) -> Result:
        """The capacity model's prediction for this run."""
        mapping = Mapping(
            batch_size=self.mapping.batch_size,
            timeout=self.mapping.timeout,
            retry_attempts=self.mapping.retry_attempts,
            record_age=self.mapping.record_age,
        )
        backlog = Backlog(enabled=self.backlog, concurrency=self.drain_concurrency, quota_wait=QUOTA_WAIT)
        return simulate(Expiry(self.sessions), mapping, HARNESS_WORKER, Quotas(kms=self.quota), backlog)

    @property
    def lossless(self) -> bool:
        return self.backlog


@dataclass
class Measured:
    delivered: Delivered
    left: dict[str, int]  # what remains of the ended sessions: objects, grants, open sockets
    on_failure_queue: int  # messages in the on-failure queue
    drained: float = 0.0  # seconds until the backlog was empty (with a backlog)

    @property
    def seconds(self) -> float:
        return max(self.delivered.seconds, self.drained)


def residue(world: World, ended: list[Made]) -> dict[str, int]:
    """What is left of ended sessions: objects, grants, open sockets."""
    objects, grants = set(world.stack.objects("sessions/")), world.stack.grant_ids()
    return {
        "objects": sum(key in objects for made in ended for key in made.objects),
        "grants": sum(made.grant_id in grants for made in ended),
        "sockets": sum(made.socket is not None and not made.socket.wait_closed(2.0) for made in ended),
    }


def run(world: World, scale: Run) -> Measured:
    """Make the sessions, end them at once, and deliver their records under the quota."""
    ended = world.make_sessions(new_ids(scale.sessions, "mass"), sockets=scale.sockets, objects=1)
    world.end(ended)
    records = [record for record in world.records() if record["eventName"] == "REMOVE"]  # the mapping's filter
    sqs = shared_client("sqs")
    queue = sqs.create_queue(QueueName=f"on-failure-{time.monotonic_ns()}")["QueueUrl"]

    def discard(batch: list[dict[str, Any]], condition: str) -> None:
        sqs.send_message(QueueUrl=queue, MessageBody=on_failure_message(batch, world.stack.stream_arn, condition))

    backlog = sqs.create_queue(QueueName=f"backlog-{time.monotonic_ns()}")["QueueUrl"] if scale.backlog else None
    timeouts: dict[str, Any] = {"botocore_max_attempts": 3, "http_timeout_seconds": 5.0, "bulk_timeout_seconds": 30.0}
    timeouts["retry_max_wait_seconds"] = 2.0
    stream = world.runtime(**timeouts, backlog_queue_url=backlog, quota_wait_seconds=QUOTA_WAIT if backlog else None)
    world.plan.quotas = {"kms:RetireGrant": scale.quota}
    if backlog is None:
        return _measure(
            world, ended, queue, deliver(records, _invoker(stream, lambda_handler.handler), scale.mapping, discard)
        )
    # One runtime per drain invocation at once: Lambda runs each in an environment of its own, learning the quota
    # apart (with one runtime between them, the drain would be one learner where production has MaximumConcurrency).
    drainers = [_drainer(world.runtime(**timeouts)) for _ in range(scale.drain_concurrency)]
    with ThreadPoolExecutor(1) as pool:
        delivering = pool.submit(deliver, records, _invoker(stream, lambda_handler.handler), scale.mapping, discard)
        drained = drain_queue(
            sqs,
            backlog,
            drainers,
            timeout=scale.mapping.timeout if scale.drain_timeout is None else scale.drain_timeout,
            concurrency=scale.drain_concurrency,
            stream_done=delivering.done,
        )
        measured = _measure(world, ended, queue, delivering.result())
    measured.drained = drained
    return measured


def _invoker(runtime: Runtime, handler: Any, warm: Any = lambda_handler.warm) -> Any:
    def invoke(event: dict[str, Any], context: Any) -> dict[str, Any]:
        with warm.use(runtime):
            return dict(handler(event, context))

    return invoke


def _drainer(runtime: Runtime) -> Any:
    """The drain's handler in an environment of its own, warm with ``runtime`` (``worker.backlog.handler``, whose
    warm runtime is one per process)."""

    def invoke(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return dict(backlog_handler.drain(event.get("Records") or [], runtime, Deadline.from_lambda_context(context)))

    return invoke


def _measure(world: World, ended: list[Made], queue: str, delivered: Delivered) -> Measured:
    sqs = shared_client("sqs")
    world.plan.enabled = False
    attributes = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessages"])
    return Measured(delivered, residue(world, ended), int(attributes["Attributes"]["ApproximateNumberOfMessages"]))


def report(scale: Run, measured: Measured, predicted: Result) -> list[str]:
    """The measured figures next to the model's, and whether they agree within 15%."""
    drain = measured.seconds
    model_drain = model_seconds(scale, predicted)
    what = "every grant retired" if scale.backlog else "shard through"
    lines = [
        f"sessions {scale.sessions}, RetireGrant quota {scale.quota:.0f}/s, {scale.mapping}",
        "| figure | measured | model | difference |",
        "|---|---:|---:|---:|",
        f"| {what} (s) | {drain:.1f} | {model_drain:.1f} | {_difference(drain, model_drain)} |",
        f"| sessions discarded uncleaned (grants left) | {measured.left['grants']} | {predicted.lost} "
        f"| {_difference(measured.left['grants'], predicted.lost)} |",
        f"| records in on-failure messages | {measured.delivered.discarded} | | |",
        f"| invocations | {measured.delivered.invocations} | {predicted.invocations} | |",
        f"left of the ended sessions: {measured.left}; on-failure messages: {measured.on_failure_queue}; "
        f"stream through in {measured.delivered.seconds:.1f} s (model: sockets and scratch free at "
        f"{predicted.sockets_closed or 0:.1f} s, {predicted.deferred} deferred)",
    ]
    return lines


def model_seconds(scale: Run, predicted: Result) -> float:
    """The model's figure for the measured drain time: the last grant retired (backlog), or the shard through."""
    return (predicted.grants_retired or predicted.ended) if scale.backlog else predicted.ended


def _difference(measured: float, model: float) -> str:
    if model == 0:
        return "-" if measured == 0 else "n/a"
    return f"{(measured - model) / model:+.0%}"


def within(measured: float, model: float, share: float = 0.15) -> bool:
    return abs(measured - model) <= share * max(model, 1e-9) or measured == model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=Run.sessions)
    parser.add_argument("--quota", type=float, default=Run.quota, help="RetireGrant a second")
    parser.add_argument("--record-age", type=float, default=Run.mapping.record_age)
    parser.add_argument("--timeout", type=float, default=Run.mapping.timeout)
    parser.add_argument("--backlog", action="store_true", help="defer quota-bound work (record age: none)")
    args = parser.parse_args(argv)
    logging.getLogger(LOGGER_NAME).addHandler(logging.NullHandler())
    logging.getLogger(LOGGER_NAME).propagate = False
    record_age = -1.0 if args.backlog else args.record_age
    # With the backlog, the template's defaults (MaximumRetryAttempts 5, no record age, BatchSize 100, the drain's
    # MaximumConcurrency 2, QUOTA_WAIT_SECONDS 0.1), on one lane: the harness delivers a shard's batches in turn.
    retries = 5 if args.backlog else -1
    mapping = MappingSettings(batch_size=100, timeout=args.timeout, retry_attempts=retries, record_age=record_age)
    scale = Run(sessions=args.sessions, quota=args.quota, mapping=mapping, backlog=args.backlog)
    plan = FaultPlan(rate=0.0, seed=1, delay_seconds=HTTP_TIMEOUT + 0.3)
    with LocalAws() as aws, LocalGateway() as gateway:
        aws.use()
        with FaultProxy(aws.endpoint_url, plan) as aws_proxy, FaultProxy(gateway.callback_url, plan) as gw_proxy:
            world = World(SessionStack.create(aws, "mass-expiry"), gateway, plan, aws_proxy, gw_proxy)
            measured = run(world, scale)
    predicted = scale.model()
    print("\n".join(report(scale, measured, predicted)))
    agree = within(measured.seconds, model_seconds(scale, predicted)) and within(
        measured.left["grants"], predicted.lost
    )
    print("agree within 15%" if agree else "DISAGREE by more than 15%")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
