"""Run every benchmark in one go and print the figures and their ratios as Markdown.

.venv/bin/python -m benchmarks.run            # the full run (~6 minutes on 2 cores)
.venv/bin/python -m benchmarks.run --quick    # smaller sizes, for a first look
.venv/bin/python -m benchmarks.run --smoke    # the smallest sizes: every section runs (CI's bench tier)
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from benchmarks import cold, decoding, noise, quota
from benchmarks import own_costs as costs
from benchmarks.alternatives import PowertoolsHandler, SequentialHandler
from benchmarks.latency_proxy import LatencyProxy
from benchmarks.stub_aws import StubAws
from benchmarks.throughput import Result, ideal_seconds, minimum_calls, per_session, plot, run_alternative, run_worker
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
    stub_batch: int
    turns: int
    quota_batch: int = 200  # sessions in one batch under a RetireGrant quota of QUOTA_BATCH a second
    quota_expiry: int = 200  # sessions of a mass expiry under QUOTA_EXPIRY a second
    noise_batch: int = 300  # sessions a batch, before, under and after scattered throttling


QUOTA_BATCH, QUOTA_EXPIRY = 5.0, 3.0
NOISE = 0.2  # of requests answered throttled at random, in section 9d
FULL = Sizes(1000, 100, {1: 25, 4: 200, 16: 200, 64: 200}, 10_000, (1_000, 10_000), 10_000, 1000, 3)
SMOKE = Sizes(100, 10, {1: 5, 4: 20, 16: 20, 64: 20}, 500, (1_000,), 500, 100, 1, 40, 30, 20)
BIG_PREFIX = 100_000  # moto lists a prefix in time proportional to the bucket: 100 pages of it take ~90 s
QUICK = Sizes(300, 25, {1: 10, 4: 50, 16: 50, 64: 50}, 2_000, (1_000, 10_000), 2_000, 300, 1, 40, 30, 100)
BEFORE = "972c24c"  # the commit before calls were shared across sessions and CPU was trimmed


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
    operations = list(minimum_calls(3))
    out("## 2. AWS calls per session (botocore before-call events)\n")
    out("| case | " + " | ".join(operations) + " | total | GetBucketVersioning (per process) |")
    out("|---|" + "---:|" * (len(operations) + 2))
    rows = [
        (f"minimum, 3 objects, batch of {first.records}", minimum_calls(3, first.records), None),
        ("worker, first delivery", per_session(first.calls, first.records), first.calls["GetBucketVersioning"]),
        ("worker, second delivery", per_session(again.calls, again.records), again.calls["GetBucketVersioning"]),
        ("minimum, one session of 2,500 objects", minimum_calls(2500), None),
        ("worker, one session of 2,500 objects", per_session(big.calls, 1), big.calls["GetBucketVersioning"]),
    ]
    for name, counts, versioning in rows:
        cells = " | ".join(f"{counts.get(op, 0):.3g}" for op in operations)
        total = sum(counts.get(op, 0) for op in operations)
        out(f"| {name} | {cells} | {total:.3f} | {'' if versioning is None else versioning} |")
    total = sum(per_session(first.calls, first.records).values())
    out(f"\ncalls per session, batch of {first.records}, 3 objects each: {total:.3f} (target <= 3.1)")
    out(f"second delivery of the same batch: {again.seconds:.2f} s ({again.per_second:.0f} records/s)\n")


def own_costs(sizes: Sizes, before: str) -> None:
    """Sections 7 and 8: against the stub AWS, CPU per session before and after, where it goes, the ceiling, and
    the Lambda sizing that follows."""
    with StubAws(LATENCY) as stub, costs.earlier_tree(before) as earlier:
        compared = costs.compare(stub, earlier, sizes.stub_batch, sizes.turns)
        shares_before = costs.profile_shares(stub, earlier, sizes.stub_batch)
        shares_after = costs.profile_shares(stub, costs.ROOT, sizes.stub_batch)
    before_ms, after_ms = (
        costs.Comparison.median_cpu(compared.before),
        costs.Comparison.median_cpu(compared.after),
    )
    out(f"## 7. The worker's own costs, against a stub AWS ({LATENCY * 1000:.0f} ms a call, no moto)\n")
    out(
        f"{sizes.stub_batch} sessions (1 connection, 1 grant, 3 objects each), default settings, warm, logs on; "
        f"{sizes.turns} turns each, in alternation; before = commit {before}\n"
    )
    out("| worker | client CPU ms / session (median) | each turn | calls / session | seconds (median) | sessions/s |")
    out("|---|---:|---|---:|---:|---:|")
    for name, runs in (("before", compared.before), ("after", compared.after)):
        turns = ", ".join(f"{run.cpu_ms_per_session:.2f}" for run in runs)
        seconds = statistics.median(run.seconds for run in runs)
        calls = runs[0].total_calls / runs[0].sessions
        median_cpu = costs.Comparison.median_cpu(runs)
        out(f"| {name} | {median_cpu:.2f} | {turns} | {calls:.3f} | {seconds:.2f} | {sizes.stub_batch / seconds:.0f} |")
    out(f"\n- client CPU per session: {before_ms:.2f} -> {after_ms:.2f} ms, {compared.saving:.0%} less (target >= 35%)")
    best = min(compared.after, key=lambda run: run.seconds)
    ideal = costs.ideal_seconds(best)
    out(
        f"- ceiling: {best.seconds:.2f} s for {best.sessions} sessions ({best.per_second:.0f}/s, "
        f"{best.cpu_seconds:.2f} s of CPU) against the latency-only ideal of {best.total_calls} calls x "
        f"{LATENCY * 1000:.0f} ms / 32 = {ideal:.2f} s: {best.seconds / ideal:.2f}x (target <= 1.5x); "
        f"CPU alone is {best.cpu_seconds / ideal:.2f}x"
    )
    out("\nWhere the CPU goes (cProfile of every thread with a CPU clock; each part's cumulative share of the profile,")
    out("times the median CPU per session above):\n")
    out("| part | before ms / session | after ms / session |")
    out("|---|---:|---:|")
    for (label, before_share), (_, after_share) in zip(shares_before, shares_after, strict=True):
        name = label.replace("  ", "&nbsp;&nbsp;")
        before_cell = f"{before_share * before_ms:.2f} ({before_share:.0%})"
        out(f"| {name} | {before_cell} | {after_share * after_ms:.2f} ({after_share:.0%}) |")
    out("\n## 8. Lambda sizing (one invocation; CPU in proportion to memory, a full vCPU at 1,769 MB)\n")
    out("| memory MB | vCPU | sessions/s | arm64 cost per million sessions |")
    out("|---:|---:|---:|---:|")
    for row in costs.sizing(after_ms, best.per_second):
        out(f"| {row['memory']:.0f} | {row['vcpu']:.2f} | {row['per_second']:.0f} | ${row['cost']:.2f} |")
    out(f"\nfrom {after_ms:.2f} ms of CPU per session, capped at the ceiling on a full core ({best.per_second:.0f}/s)")
    out()


def pacing(sizes: Sizes) -> None:
    """Section 9: pacing under a RetireGrant quota, as ratios (``benchmarks.quota``); 9d: under scattered throttling
    (``benchmarks.noise``)."""
    results = quota.measure(sizes.quota_batch, QUOTA_BATCH, sizes.quota_expiry, QUOTA_EXPIRY)
    out("## 9. Pacing under a request quota (the fault proxy's RetireGrant quota; moto, no latency)\n")
    out("\n".join(quota.table(results)))
    out()
    results_noise = noise.measure(sizes.noise_batch, NOISE)
    out("## 9d. Pacing under scattered throttling (the fault proxy's throttling answers at random; moto, no latency)\n")
    out("\n".join(noise.table(results_noise)))
    out()


def sweep(world: World, sizes: Sizes, flat: list[Result], plot_to: Path) -> None:
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
    plot(results, flat, ideal, plot_to)
    out(f"\nplot: {os.path.relpath(plot_to)}\n")


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
    parser.add_argument("--smoke", action="store_true", help="the smallest sizes: only that every section runs")
    parser.add_argument("--big", action="store_true", help=f"also a prefix of {BIG_PREFIX:,} objects (~2 minutes)")
    parser.add_argument("--before", default=BEFORE, help=f"the commit to compare CPU with (default {BEFORE})")
    parser.add_argument(
        "--own-costs",
        action="store_true",
        help="only sections 7 and 8 (the stub AWS, before and after)",
    )
    parser.add_argument("--plot", type=Path, default=HERE / "throughput.png", help="where section 6's plot goes")
    args = parser.parse_args()
    sizes = SMOKE if args.smoke else QUICK if args.quick else FULL
    if args.big:
        sizes = replace(sizes, prefixes=(*sizes.prefixes, BIG_PREFIX))
    os.environ.update(CREDENTIAL_ENV | {"AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"})
    started = time.perf_counter()
    out(f"# Benchmarks ({'smoke' if args.smoke else 'quick' if args.quick else 'full'} run)\n")
    out(
        f"machine: {platform.processor() or platform.machine()}, {psutil.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}; "
        f"load average at start {os.getloadavg()[0]:.1f}\n"
    )
    if args.own_costs:
        own_costs(sizes, args.before)
        return 0
    with World() as world:
        gateway = urlsplit(world.endpoints["gateway"])
        with (
            LatencyProxy(world.endpoints["aws"], LATENCY) as aws_proxy,
            LatencyProxy(f"http://{gateway.netloc}", LATENCY) as gateway_proxy,
        ):
            world.endpoints["aws_proxy"] = aws_proxy.url
            world.endpoints["gateway_proxy"] = f"{gateway_proxy.url}{gateway.path}"
            flat, _ = throughput(world, sizes)
            sweep(world, sizes, flat, args.plot)
            decode(sizes)
            memory_and_cold_start(world, sizes)
    own_costs(sizes, args.before)
    pacing(sizes)
    out(f"total time: {time.perf_counter() - started:.0f} s; load average at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
