"""Run every benchmark in one go and print the figures and their ratios as Markdown.

.venv/bin/python -m benchmarks.run            # the full run (~4 minutes on 2 cores)
.venv/bin/python -m benchmarks.run --quick    # smaller sizes, for a first look
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from benchmarks import cold, decoding
from benchmarks.baseline_sequential import SequentialHandler
from benchmarks.latency_proxy import LatencyProxy
from benchmarks.plot import plot
from benchmarks.powertools_batch import PowertoolsHandler
from benchmarks.throughput import Result, ideal_seconds, minimum_calls, per_session, run_alternative, run_worker
from benchmarks.world import World
from worker.local.backend import CREDENTIAL_ENV

LATENCY = 0.02
HERE = Path(__file__).parent


@dataclass(frozen=True)
class Sizes:
    batch: int
    alternatives: int
    sweep: dict[int, int]
    decode: int
    prefixes: tuple[int, ...]
    memory_batch: int


FULL = Sizes(1000, 100, {1: 25, 4: 200, 16: 200, 64: 200}, 10_000, (1_000, 10_000), 10_000)
BIG_PREFIX = 100_000  # moto lists a prefix in time proportional to the bucket: 100 pages of it take ~90 s
QUICK = Sizes(200, 25, {1: 10, 4: 50, 16: 50, 64: 50}, 2_000, (1_000, 10_000), 2_000)


def out(line: str = "") -> None:
    print(line, flush=True)


def throughput(world: World, sizes: Sizes) -> tuple[list[Result], list[Result]]:
    """Section 1: the worker with default settings, the two sequential alternatives, moto without the proxy."""
    proxied, again = run_worker(world, sizes.batch, world.endpoints["aws_proxy"], redeliver=True)
    direct = run_worker(world, sizes.batch, world.endpoints["aws"], "moto's capacity (worker, no proxy)")[0]
    subset, of = sizes.alternatives, sizes.batch
    baseline = run_alternative(world, subset, "sequential baseline (boto3)", SequentialHandler, of=of)
    powertools = run_alternative(world, subset, "Powertools BatchProcessor", PowertoolsHandler, of=of)
    ideal = ideal_seconds(proxied, LATENCY)
    binding = max(ideal, direct.seconds)
    out("## 1. Batch throughput (REMOVE records: 1 connection, 1 grant, 3 objects each; 20 ms per call)\n")
    out("| handler | records | seconds | records/s | calls | client CPU s | vs baseline |")
    out("|---|---:|---:|---:|---:|---:|---:|")
    for result in (proxied, direct, baseline, powertools):
        out(
            f"| {result.name} | {result.records} | {result.seconds:.2f} | {result.per_second:.1f} | "
            f"{result.total_calls} | {result.cpu_seconds:.2f} | {result.per_second / baseline.per_second:.1f}x |"
        )
    out(f"\n- ideal: {proxied.total_calls} calls x {LATENCY * 1000:.0f} ms / {proxied.concurrency} = {ideal:.2f} s")
    out(f"- moto's own capacity (the same batch size, no proxy): {direct.seconds:.2f} s")
    out(f"- binding limit: {'moto' if direct.seconds > ideal else 'latency'}, {binding:.2f} s")
    out(f"- worker / binding limit: {proxied.seconds / binding:.2f}x (target <= 1.5x)")
    out(f"- worker / sequential baseline: {proxied.per_second / baseline.per_second:.1f}x (target >= 10x)\n")
    calls(world, proxied, again)
    return [baseline, powertools, direct], [proxied]


def calls(world: World, first: Result, again: Result) -> None:
    """Section 2: calls per session against the minimum, and what a second delivery costs."""
    big = run_worker(world, 1, world.endpoints["aws"], "one session of 2,500 objects", objects=2500)[0]
    out("## 2. AWS calls per session (botocore before-call events)\n")
    out("| case | " + " | ".join(minimum_calls(3)) + " | GetBucketVersioning (per process) |")
    out("|---|" + "---:|" * (len(minimum_calls(3)) + 1))
    rows = [
        ("minimum, 3 objects", minimum_calls(3), None),
        ("worker, first delivery", per_session(first.calls, first.records), first.calls["GetBucketVersioning"]),
        ("worker, second delivery", per_session(again.calls, again.records), again.calls["GetBucketVersioning"]),
        ("minimum, 2,500 objects", minimum_calls(2500), None),
        ("worker, 2,500 objects", per_session(big.calls, 1), big.calls["GetBucketVersioning"]),
    ]
    for name, counts, versioning in rows:
        cells = " | ".join(f"{counts.get(op, 0):g}" for op in minimum_calls(3))
        out(f"| {name} | {cells} | {'' if versioning is None else versioning} |")
    out(f"\nsecond delivery of the same batch: {again.seconds:.2f} s ({again.per_second:.0f} records/s)\n")


def sweep(world: World, sizes: Sizes, flat: list[Result]) -> None:
    """Section 6: throughput against MAX_CONCURRENCY, and the plot."""
    results = []
    for level, records in sizes.sweep.items():
        name = f"MAX_CONCURRENCY={level}"
        results.append(run_worker(world, records, world.endpoints["aws_proxy"], name, max_concurrency=level)[0])
    out("## 6. Throughput against concurrency (behind the proxy)\n")
    out("| MAX_CONCURRENCY | records | records/s | ideal records/s |")
    out("|---:|---:|---:|---:|")
    ideal = {}
    for result in results:
        ideal[result.concurrency] = result.records / ideal_seconds(result, LATENCY)
        out(f"| {result.concurrency} | {result.records} | {result.per_second:.1f} | {ideal[result.concurrency]:.0f} |")
    plot(results, flat, ideal, HERE / "throughput.png")
    out("\nplot: benchmarks/throughput.png\n")


def decode(sizes: Sizes) -> None:
    """Section 3."""
    rates = decoding.measure(sizes.decode)
    boto3 = rates["boto3 TypeDeserializer"]
    out(f"## 3. Decoding {sizes.decode:,} mixed-type records (OldImage; results checked equal first)\n")
    out("| decoder | records/s | vs boto3 |")
    out("|---|---:|---:|")
    for name, rate in rates.items():
        out(f"| {name} | {rate:,.0f} | {rate / boto3:.2f}x |")
    out()


def memory_and_cold_start(world: World, sizes: Sizes) -> None:
    """Sections 4 and 5."""
    out("## 4. Peak RSS of a cold process (MB)\n")
    out("| case | before the handler | peak | handler s |")
    out("|---|---:|---:|---:|")
    for objects in sizes.prefixes:
        report = cold.prefix_memory(world, objects)
        out(
            f"| one prefix of {objects:,} objects | {report['rss_before_mb']:.0f} | {report['peak_rss_mb']:.0f} | "
            f"{report['handler_seconds']:.1f} |"
        )
    report = cold.batch_memory(world, sizes.memory_batch)
    out(
        f"| batch of {sizes.memory_batch:,} records (AWS stubbed in-process) | {report['rss_before_mb']:.0f} | "
        f"{report['peak_rss_mb']:.0f} | {report['handler_seconds']:.1f} |"
    )
    imports = cold.import_time()
    first = cold.first_record(world)
    out("\n## 5. Cold start\n")
    out(
        f"- `python -X importtime -c 'import worker.lambda_handler'`: {imports['total_seconds'] * 1000:.0f} ms "
        "(sum of self times); heaviest packages (cumulative): "
        + ", ".join(f"{name} {seconds * 1000:.0f} ms" for name, seconds in imports["heaviest"])
    )
    out(
        f"- process start to import done: {first['import_seconds'] * 1000:.0f} ms; to the first cleaned record "
        f"answered (behind the proxy): {first['first_answer_seconds'] * 1000:.0f} ms\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description="Benchmarks of the session cleanup worker.")
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--big", action="store_true", help=f"also a prefix of {BIG_PREFIX:,} objects (~2 minutes)")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    if args.big:
        sizes = replace(sizes, prefixes=(*sizes.prefixes, BIG_PREFIX))
    os.environ.update(CREDENTIAL_ENV | {"AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"})
    started = time.perf_counter()
    out(f"# Benchmarks ({'quick' if args.quick else 'full'} run)\n")
    out(
        f"machine: {platform.processor() or platform.machine()}, {psutil.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}; "
        f"load average at start {os.getloadavg()[0]:.1f}\n"
    )
    with World() as world:
        gateway = urlsplit(world.endpoints["gateway"])
        with (
            LatencyProxy(world.endpoints["aws"], LATENCY) as aws_proxy,
            LatencyProxy(f"http://{gateway.netloc}", LATENCY) as gateway_proxy,
        ):
            world.endpoints["aws_proxy"] = aws_proxy.url
            world.endpoints["gateway_proxy"] = f"{gateway_proxy.url}{gateway.path}"
            flat, _ = throughput(world, sizes)
            sweep(world, sizes, flat)
            decode(sizes)
            memory_and_cold_start(world, sizes)
    out(f"total time: {time.perf_counter() - started:.0f} s; load average at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
