"""Warm Lambda invocations in a fresh interpreter against the stub AWS: ``python benchmarks/stub_invoke.py SPEC OUT``.

Run as a script, so that the worker it imports is whichever tree is first on ``PYTHONPATH`` (this one, or an earlier
commit checked out beside it): the CPU before and after a change are measured by the same code. Settings come from
the environment as in Lambda (logs and metrics written to stdout, which the caller discards). A first, small event
warms the process (clients, pools, imports); the report is for the second, written to OUT as JSON: wall and CPU
seconds of the handler (every thread of the process), the calls made by operation (botocore ``before-call``), the
failures reported, and, when asked, the top of a cProfile of the handler.
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import sys
import threading
import time
from collections import Counter
from typing import Any


def main(spec_path: str, out_path: str) -> None:
    with open(spec_path) as spec_file:
        spec: dict[str, Any] = json.load(spec_file)
    os.environ.update(spec["env"])
    import worker.lambda_handler

    # This tree's handler keeps its runtime in ``warm``; the commit measured as "before" had ``runtime()``.
    warm_runtime = getattr(worker.lambda_handler, "warm", None)
    runtime = warm_runtime.get() if warm_runtime is not None else worker.lambda_handler.runtime()  # type: ignore[attr-defined]
    calls: Counter[str] = Counter()
    lock = threading.Lock()

    def count(model: Any, **_: Any) -> None:
        with lock:
            calls[model.name] += 1

    clients = [runtime.clients.get(service) for service in ("s3", "kms", "dynamodb")]
    clients.append(runtime.clients.management(spec["env"]["WS_CALLBACK_URL"]))
    for client in clients:
        client.meta.events.register("before-call.*.*", count)
    warm = worker.lambda_handler.handler(spec["warm"], None)
    calls.clear()
    profiles: list[cProfile.Profile] = []
    if spec.get("profile"):
        runtime.close()  # the pool's threads are made again, each with a profiler of its own
        threading.setprofile(lambda *_: _profile_thread(profiles))
        _profile_thread(profiles)
    started, cpu = time.perf_counter(), time.process_time()
    response = worker.lambda_handler.handler(spec["event"], None)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    runtime.close()
    report: dict[str, Any] = {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "calls": dict(calls),
        "failures": len(response["batchItemFailures"]) + len(warm["batchItemFailures"]),
        "code": os.path.dirname(os.path.dirname(os.path.abspath(worker.lambda_handler.__file__))),
    }
    if profiles:
        text = io.StringIO()
        stats = pstats.Stats(*profiles, stream=text)
        stats.sort_stats(spec.get("profile_sort", "tottime")).print_stats(spec.get("profile_lines", 40))
        report["profile"] = text.getvalue()
    with open(out_path, "w") as out:
        json.dump(report, out)


def _profile_thread(profiles: list[cProfile.Profile]) -> None:
    """Profile the calling thread from now on (every thread of the worker's pool, and the main one)."""
    profile = cProfile.Profile(time.thread_time)  # CPU, not the time spent waiting for answers or the GIL
    profiles.append(profile)
    profile.enable()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
