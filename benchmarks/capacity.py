"""The capacity model, as a command: how long a mass expiry takes to clean, and what it loses, before it happens.

    python -m benchmarks.capacity --sessions 1000000 --backlog --parallelization 4 --record-age -1   # the template
    python -m benchmarks.capacity --sessions 1000000                 # no backlog, record age 1 h (the template before)
    python -m benchmarks.capacity --table                            # 10k to 10M, as in docs/operate.md

The model itself is ``benchmarks.capacity_model`` (inputs and outputs) and ``benchmarks.capacity_sim`` (the engine).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from benchmarks.capacity_model import Backlog, Expiry, Mapping, Quotas, Result, Worker
from benchmarks.capacity_sim import simulate

__all__ = ["Backlog", "Expiry", "Mapping", "Quotas", "Result", "Worker", "main", "simulate"]

DEFAULTS = Mapping(record_age=-1.0, parallelization=4)  # the template's mapping, with the backlog on
RECOMMENDED = Mapping(record_age=-1.0, parallelization=10)  # and a faster stream: 10 invocations a shard, a full vCPU


def hours(seconds: float | None) -> str:
    """A duration for a table: seconds, minutes or hours; "never" for None."""
    if seconds is None:
        return "never"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def row(label: str, result: Result, quotas: Quotas) -> str:
    """One Markdown table row for a result."""
    name, share = result.binding(quotas)
    return (
        f"| {label} | {result.sessions:,} | {hours(result.sockets_closed)} | {hours(result.grants_retired)} "
        f"| {hours(result.peak_iterator_age)} | {hours(result.peak_backlog_age) if result.deferred else '-'} "
        f"| {result.on_failure_records:,} | {result.lost:,} | {name} {share:.0%} |"
    )


HEADER = (
    "| deployment | sessions | sockets and scratch free | grants retired | peak iterator age | peak backlog age "
    "| to on-failure queue | lost without a redrive | binds (use) |\n|---|---:|---:|---:|---:|---:|---:|---:|---|"
)


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    defaults, worker, quotas, backlog = Mapping(), Worker(), Quotas(), Backlog()
    parser = argparse.ArgumentParser(prog="python -m benchmarks.capacity", description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--sessions", type=int, default=1_000_000, help="sessions expiring")
    add("--rate", type=float, default=None, help="sessions expiring a second (default: all at once)")
    add("--shards", type=int, default=defaults.shards)
    add("--batch-size", type=int, default=defaults.batch_size)
    add("--parallelization", type=int, default=defaults.parallelization)
    add("--window", type=float, default=defaults.window, help="MaximumBatchingWindowInSeconds")
    add("--timeout", type=float, default=defaults.timeout, help="the function's timeout, seconds")
    add("--retry-attempts", type=int, default=defaults.retry_attempts, help="MaximumRetryAttempts (-1: none)")
    add("--record-age", type=float, default=defaults.record_age, help="MaximumRecordAgeInSeconds (-1: none)")
    add("--no-bisect", action="store_true", help="BisectBatchOnFunctionError off (no effect: the worker answers)")
    add("--retention", type=float, default=defaults.retention, help="the stream's retention, seconds")
    add("--memory", type=int, default=worker.memory_mb, help="the function's memory, MB (its CPU share)")
    add("--cpu-ms", type=float, default=worker.cpu_seconds * 1000, help="client CPU per session, ms on a vCPU")
    add("--latency-ms", type=float, default=worker.latency * 1000, help="a call's latency, ms")
    add("--max-concurrency", type=int, default=worker.max_concurrency)
    add("--pacing", type=float, default=worker.pacing, help="share of a quota the learnt rate achieves")
    add("--kms", type=float, default=quotas.kms, help="RetireGrant a second")
    add("--apigw", type=float, default=quotas.apigw, help="API Gateway requests a second")
    add("--s3", type=float, default=quotas.s3, help="S3 deletes a second per prefix")
    add("--dynamodb", type=float, default=quotas.dynamodb, help="DynamoDB read units a second")
    add("--backlog", action="store_true", help="defer quota-bound work to the backlog queue")
    add("--drain-concurrency", type=int, default=backlog.concurrency, help="the backlog mapping's MaximumConcurrency")
    add("--quota-wait", type=float, default=backlog.quota_wait, help="QUOTA_WAIT_SECONDS")
    add("--table", action="store_true", help="print the table in docs/operate.md (10k to 10M)")
    return parser.parse_args(argv)


def configure(args: argparse.Namespace) -> tuple[Expiry, Mapping, Worker, Quotas, Backlog]:
    """The model's inputs from the command line."""
    mapping = Mapping(
        shards=args.shards,
        batch_size=args.batch_size,
        parallelization=args.parallelization,
        window=args.window,
        timeout=args.timeout,
        retry_attempts=args.retry_attempts,
        record_age=args.record_age,
        bisect=not args.no_bisect,
        retention=args.retention,
    )
    worker = Worker(
        memory_mb=args.memory,
        cpu_seconds=args.cpu_ms / 1000,
        latency=args.latency_ms / 1000,
        max_concurrency=args.max_concurrency,
        pacing=args.pacing,
    )
    quotas = Quotas(kms=args.kms, apigw=args.apigw, s3=args.s3, dynamodb=args.dynamodb)
    backlog = Backlog(enabled=args.backlog, concurrency=args.drain_concurrency, quota_wait=args.quota_wait)
    return Expiry(args.sessions, args.rate), mapping, worker, quotas, backlog


def table() -> list[str]:
    """The table in docs/operate.md: bursts of 10k to 10M, without the backlog, with the defaults, and recommended."""
    lines = [HEADER]
    deployments = [
        ("no backlog, record age 1 h (the template before)", Mapping(), Backlog()),
        ("**template defaults**: backlog, ParallelizationFactor 4, record age -1", DEFAULTS, Backlog(enabled=True)),
        ("backlog, ParallelizationFactor 10, 1,769 MB", RECOMMENDED, Backlog(enabled=True)),
    ]
    for sessions in (10_000, 100_000, 1_000_000, 10_000_000):
        for label, mapping, backlog in deployments:
            worker = Worker(memory_mb=1769) if "1,769" in label else Worker()
            lines.append(row(label, simulate(Expiry(sessions), mapping, worker, backlog=backlog), Quotas()))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = _arguments(argv)
    if args.table:
        print("\n".join(table()))
        return 0
    expiry, mapping, worker, quotas, backlog = configure(args)
    result = simulate(expiry, mapping, worker, quotas, backlog)
    print(HEADER)
    print(row("this deployment", result, quotas))
    shares = ", ".join(f"{name} {share:.0%}" for name, share in result.utilisation(quotas).items())
    print(
        f"\ninvocations {result.invocations:,}; deferred to the backlog {result.deferred:,} (peak depth "
        f"{result.peak_backlog:,}); on-failure messages {result.on_failure_messages:,}; trimmed {result.trimmed:,}; "
        f"quota use {shares}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
