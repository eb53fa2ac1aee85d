"""Batch throughput and AWS calls per session: this worker against the baseline and Powertools, behind a latency proxy.

Each case gets a fresh batch from the world process (its own table, bucket and key), runs one handler over it, checks
that everything was cleaned (no object, no grant, no open socket left), and reports records per second and the calls
the handler made, counted with botocore's ``before-call`` events.

``plot`` draws the PNG: records per second against MAX_CONCURRENCY, with the sequential alternatives as flat lines.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import worker.lambda_handler
from benchmarks.world import World
from cleanup.runtime import Runtime
from schemas.settings import Settings

SERVICES = ("s3", "kms", "dynamodb")


class CallCounter:
    """AWS API calls by operation name, counted on the clients it is attached to."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def attach(self, client: Any) -> None:
        client.meta.events.register("before-call.*.*", self._count)

    def _count(self, model: Any, **_: Any) -> None:
        with self._lock:
            self.calls[model.name] += 1

    def take(self) -> Counter[str]:
        """The calls counted so far, and start again from zero."""
        with self._lock:
            taken, self.calls = self.calls, Counter()
        return taken


@dataclass
class Result:
    name: str
    records: int
    seconds: float
    cpu_seconds: float
    calls: Counter[str] = field(default_factory=Counter)
    concurrency: int = 1

    @property
    def per_second(self) -> float:
        return self.records / self.seconds

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())


def use_endpoint(url: str) -> None:
    """Point boto3 clients made from now on at ``url`` (the proxy, or moto itself)."""
    os.environ["AWS_ENDPOINT_URL"] = url


def worker_runtime(batch: dict[str, Any], callback_url: str, counter: CallCounter, **overrides: Any) -> Runtime:
    """This worker's runtime for ``batch``, default settings unless overridden, its clients counted."""
    settings = Settings(
        scratch_bucket=batch["bucket"],
        kms_key_id=batch["key_arn"],
        session_table=batch["table"],
        ws_callback_url=callback_url,
        metrics_destination="off",
        **overrides,
    )
    runtime = Runtime(settings)
    for service in SERVICES:
        counter.attach(runtime.clients.get(service))
    counter.attach(runtime.clients.management(callback_url))
    return runtime


def timed(name: str, records: int, run: Callable[[], Any], counter: CallCounter, concurrency: int = 1) -> Result:
    started, cpu = time.perf_counter(), time.process_time()
    run()
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    return Result(name, records, seconds, cpu_seconds, counter.take(), concurrency)


def check_clean(world: World, batch: dict[str, Any], name: str) -> None:
    left = world.observe(batch)
    if any(left.values()):
        raise AssertionError(f"{name} left resources behind: {left}")


def run_worker(
    world: World,
    sessions: int,
    endpoint: str,
    name: str = "worker",
    *,
    objects: int = 3,
    redeliver: bool = False,
    **overrides: Any,
) -> list[Result]:
    """This worker's Lambda handler over a fresh batch (and, if asked, the same batch delivered a second time)."""
    batch = world.populate(sessions, objects=objects)
    callback = world.endpoints["gateway_proxy"] if endpoint != world.endpoints["aws"] else world.endpoints["gateway"]
    use_endpoint(endpoint)
    counter = CallCounter()
    runtime = worker_runtime(batch, callback, counter, **overrides)
    concurrency = runtime.settings.max_concurrency

    def handle() -> None:
        response = worker.lambda_handler.handler(batch["event"], None)
        if response["batchItemFailures"]:
            raise AssertionError(f"{name}: {len(response['batchItemFailures'])} records failed")

    with worker.lambda_handler.warm.use(runtime):
        results = [timed(name, sessions, handle, counter, concurrency)]
        check_clean(world, batch, name)
        if redeliver:
            results.append(timed(f"{name} (second delivery)", sessions, handle, counter, concurrency))
    runtime.close()
    return results


def run_alternative(world: World, sessions: int, name: str, factory: Callable[..., Any], *, of: int) -> Result:
    """The baseline or the Powertools variant over the first ``sessions`` records of a fresh batch of ``of``.

    The batch is as large as the worker's so that moto, whose listings grow with the bucket, is as slow for both.
    """
    batch = world.populate(of)
    event = {"Records": batch["event"]["Records"][:sessions]}
    use_endpoint(world.endpoints["aws_proxy"])
    callback = world.endpoints["gateway_proxy"]
    handler = factory(bucket=batch["bucket"], kms_key_id=batch["key_arn"], callback_url=callback)
    counter = CallCounter()
    for client in vars(getattr(handler, "actions", handler)).values():
        if hasattr(client, "meta"):
            counter.attach(client)
    result = timed(name, sessions, lambda: handler(event, None), counter)
    left = world.observe(batch)
    unprocessed = of - sessions
    if left != {"objects": 3 * unprocessed, "grants": unprocessed, "sockets_open": unprocessed}:
        raise AssertionError(f"{name} did not clean exactly its {sessions} sessions: {left} left of {of}")
    return result


def ideal_seconds(result: Result, latency: float) -> float:
    """Every call of the run at ``latency``, ``concurrency`` at a time, and nothing else."""
    return result.total_calls * latency / result.concurrency


def per_session(calls: Counter[str], sessions: int) -> dict[str, float]:
    """Calls per session by operation; GetBucketVersioning (once per process) is left out and reported apart."""
    return {name: count / sessions for name, count in sorted(calls.items()) if name != "GetBucketVersioning"}


def minimum_calls(objects: int, sessions: int = 1) -> dict[str, float]:
    """The fewest calls a session can be cleaned with in a batch of ``sessions``: its connection, its grant and the
    listing of its prefix's pages, and its share of the batch's reads (BatchGetItem, 100 keys) and deletions
    (DeleteObjects, 1,000 keys a call, shared by the batch's sessions)."""
    pages = max(1, math.ceil(objects / 1000))
    return {
        "BatchGetItem": math.ceil(sessions / 100) / sessions,
        "DeleteConnection": 1,
        "DeleteObjects": math.ceil(objects * sessions / 1000) / sessions,
        "ListObjectsV2": pages,
        "RetireGrant": 1,
    }


def plot(sweep: list[Result], flat: list[Result], ideal: dict[int, float], path: Path) -> None:
    """Write the throughput plot to ``path`` (matplotlib, Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=110)
    levels = [result.concurrency for result in sweep]
    axes.plot(levels, [r.per_second for r in sweep], "o-", label="this worker (MAX_CONCURRENCY)")
    axes.plot(levels, [ideal[c] for c in levels], ":", color="grey", label="ideal: calls x 20 ms / concurrency")
    for result, style, colour in zip(flat, ("--", "-.", "-"), ("tab:red", "tab:orange", "tab:green"), strict=False):
        axes.axhline(result.per_second, linestyle=style, color=colour, alpha=0.8, label=result.name)
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xticks(levels, [str(level) for level in levels])
    axes.set_xlabel("concurrency")
    axes.set_ylabel("records / s")
    axes.set_title("Session cleanup throughput, moto over HTTP behind a 20 ms proxy")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
