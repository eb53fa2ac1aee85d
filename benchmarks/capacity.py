"""The capacity model: how long a mass expiry takes to clean, and what it loses, before it happens.

    python -m benchmarks.capacity --sessions 1000000 --backlog --parallelization 4 --record-age -1   # the template
    python -m benchmarks.capacity --sessions 1000000                 # no backlog, record age 1 h (the template before)
    python -m benchmarks.capacity --table                            # 10k to 10M, as in docs/operate.md

A discrete-event simulation of the Lambda event source mapping and the worker, an invocation at a time per lane (a
shard, or a ParallelizationFactor slice of one), with the stream's records, the quotas shared by every lane, and,
with a backlog, the backlog queue's drain. What it models of the worker as it is:

* Each invocation cleans its batch at the lane's pace: the CPU share of its memory over the worker's CPU per session,
  or its concurrency over its calls' latency, or its share of a quota, whichever is least. A session's scratch data
  and socket go first; its grant waits for a turn at the rate the worker learnt (``cleanup/aws/pacing.py``), which
  is its share of the KMS quota.
* Without a backlog, a grant whose turn comes after the invocation's deadline fails its record (transient); the
  mapping retries from the lowest failed record, so the shard moves at the grant quota. After MaximumRetryAttempts
  retries, or once a record is older than MaximumRecordAgeInSeconds, the mapping sends the rest of the batch to the
  on-failure destination (its range only: the records are lost unless someone redrives them within the stream's
  retention). The worker answers before its timeout, so BisectBatchOnFunctionError never splits a batch here.
* With a backlog (``BACKLOG_QUEUE_URL``), a grant with no turn within QUOTA_WAIT_SECONDS is deferred: the record
  goes to the backlog queue with only its grant left, and the stream moves on at the CPU's pace. The backlog's drain
  (MaximumConcurrency invocations) shares the quota with the stream; a message older than the queue's retention
  would be lost.

The engine: each lane (a shard, or a ParallelizationFactor slice of it) is an event: at its time it drops what the
stream no longer holds, sends what is too old to the on-failure queue, waits for a batch, or runs one invocation and
comes back when that invocation ends. The backlog drains as a fluid between events, at its share of the KMS quota,
oldest message first. Quotas are shared equally by whatever uses them at that moment (every process learns its share
from its own throttling, and together they keep to the quota: ``Worker.pacing``).
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

CPU_SECONDS_PER_SESSION = 0.0048  # client CPU on a full vCPU (benchmarks/README.md, sections 7 and 8)
FULL_VCPU_MB = 1769  # Lambda gives one full vCPU at this memory size
DAY = 86_400.0


@dataclass(frozen=True)
class Expiry:
    """How the sessions end: ``sessions`` at ``rate`` a second, or all at once (a burst) when ``rate`` is None."""

    sessions: int
    rate: float | None = None


@dataclass(frozen=True)
class Mapping:
    """The event source mapping (the template's defaults) and the stream."""

    shards: int = 1
    batch_size: int = 100
    parallelization: int = 1
    window: float = 1.0  # MaximumBatchingWindowInSeconds
    timeout: float = 120.0  # the function's
    retry_attempts: int = 5  # -1: until the record expires
    record_age: float = 3600.0  # MaximumRecordAgeInSeconds; -1: only the stream's retention
    bisect: bool = True
    retention: float = DAY  # a DynamoDB stream keeps records 24 h
    discard_rate: float = 4000.0  # records a second a lane passes to the on-failure queue (4 polls of 1,000)


@dataclass(frozen=True)
class Worker:
    """The worker's measured costs and its own pacing."""

    memory_mb: int = 1024
    cpu_seconds: float = CPU_SECONDS_PER_SESSION
    latency: float = 0.020  # seconds a call takes
    max_concurrency: int = 32
    overhead: float = 0.05  # seconds an invocation costs besides its records
    pacing: float = 1.0  # the share of a quota the learnt rate achieves (measured: 1.00-1.07)
    # seconds of the timeout no request starts in: a second kept to answer, and 0.75 s without time for a connection
    # (0.5 s) and a minimal read (0.25 s) before the deadline (cleanup/aws/retry.py, cleanup/aws/pacing.py)
    margin: float = 1.75
    # In an invocation cut short by the quota, the share of its retired grants that come before its first failed
    # record: records throttled while the learnt rate probes above the quota (it grows while requests wait) fail out of
    # order, and the mapping resumes from the lowest. Measured 0.5 (benchmarks/README.md, the calibration run).
    in_order: float = 0.5
    # requests a session makes of each quota: RetireGrant; DeleteConnection; a listing and its share of DeleteObjects;
    # a consistent read (1 RCU) for the race check
    demand: tuple[tuple[str, float], ...] = (("kms", 1.0), ("apigw", 1.0), ("s3", 1.03), ("dynamodb", 1.0))

    @property
    def calls(self) -> float:
        return 3.06  # measured calls a session makes in a batch (BatchGetItem and DeleteObjects shared)

    @property
    def rate(self) -> float:
        """Sessions a second one invocation cleans, bound by its CPU share or its concurrency."""
        vcpu = min(1.0, self.memory_mb / FULL_VCPU_MB)
        return min(vcpu / self.cpu_seconds, self.max_concurrency / (self.calls * self.latency))


@dataclass(frozen=True)
class Quotas:
    """Requests a second per account and Region (AWS's defaults); S3's is per partitioned prefix."""

    kms: float = 50.0  # RetireGrant
    apigw: float = 10_000.0  # shared by every API and @connections call
    s3: float = 3_500.0  # DELETE / LIST per prefix
    dynamodb: float = 40_000.0  # read request units a second, an on-demand table's default


@dataclass(frozen=True)
class Backlog:
    """The durable backlog for quota-bound work (off: the worker as it was)."""

    enabled: bool = False
    concurrency: int = 2  # the SQS mapping's ScalingConfig.MaximumConcurrency
    retention: float = 14 * DAY
    quota_wait: float = 0.1  # QUOTA_WAIT_SECONDS: how long a stream record waits for a turn before it is deferred


@dataclass
class Result:
    """What the simulation found; times in seconds from the first expiry, None: never (resources left)."""

    sessions: int
    sockets_closed: float | None = None
    scratch_deleted: float | None = None
    grants_retired: float | None = None
    peak_iterator_age: float = 0.0
    peak_backlog_age: float = 0.0
    peak_backlog: int = 0
    on_failure_records: int = 0
    on_failure_messages: int = 0
    trimmed: int = 0  # records the stream dropped before they were read
    backlog_lost: int = 0
    deferred: int = 0
    invocations: int = 0
    ended: float = 0.0  # the last event: the stream and the backlog both empty
    used: dict[str, float] = field(default_factory=dict)  # requests sent, per quota

    @property
    def lost(self) -> int:
        """Records whose cleanup never happens without a manual redrive."""
        return self.on_failure_records + self.trimmed + self.backlog_lost

    @property
    def finished(self) -> float:
        times = (self.sockets_closed, self.scratch_deleted, self.grants_retired)
        return max((t for t in times if t is not None), default=0.0)

    def utilisation(self, quotas: Quotas) -> dict[str, float]:
        """Each quota's share used over the time until the last resource was freed."""
        span = max(self.finished, self.ended) or 1.0
        return {name: used / (getattr(quotas, name) * span) for name, used in self.used.items()}

    def binding(self, quotas: Quotas) -> tuple[str, float]:
        shares = self.utilisation(quotas)
        name = max(shares, key=lambda n: shares[n])
        return name, shares[name]


@dataclass
class _Lane:
    index: int
    count: int
    interval: float  # seconds between two of its records' arrivals (0: a burst)
    position: int = 0
    seen: int = 0  # records whose socket and scratch data were already freed
    attempts: int = 0
    ahead: int = 0  # records just past the position whose grant is already retired (delivered again all the same)

    def arrival(self, i: int) -> float:
        return i * self.interval

    def arrived(self, t: float) -> int:
        if self.interval == 0:
            return self.count
        return min(self.count, int(t / self.interval + 1e-9) + 1)  # a record due now has arrived, rounding aside

    def first_younger(self, t: float, age: float) -> int:
        """The first record of the lane arrived after ``t - age``."""
        if self.interval == 0:
            return self.position if t - age <= 0 else self.count
        return min(self.count, max(self.position, math.floor((t - age) / self.interval) + 1))

    @property
    def done(self) -> bool:
        return self.position >= self.count


SQS_BATCH = 10  # records a SendMessageBatch defers


def simulate(
    expiry: Expiry,
    mapping: Mapping | None = None,
    worker: Worker | None = None,
    quotas: Quotas | None = None,
    backlog: Backlog | None = None,
) -> Result:
    """Simulate the expiry through the deployment; the result names what was freed when, and what was lost."""
    return _Simulation(expiry, mapping or Mapping(), worker or Worker(), quotas or Quotas(), backlog or Backlog()).run()


class _Simulation:
    def __init__(self, expiry: Expiry, mapping: Mapping, worker: Worker, quotas: Quotas, backlog: Backlog) -> None:
        self.mapping, self.worker, self.quotas, self.backlog = mapping, worker, quotas, backlog
        lanes = max(1, mapping.shards * mapping.parallelization)
        interval = 0.0 if expiry.rate is None else lanes / expiry.rate
        share, extra = divmod(expiry.sessions, lanes)
        self.lanes = [_Lane(i, share + (i < extra), interval) for i in range(lanes)]
        self.running = sum(not lane.done for lane in self.lanes)
        self.result = Result(sessions=expiry.sessions, used={name: 0.0 for name, _ in worker.demand})
        self.seen = 0  # sessions whose socket and scratch data are freed
        self.retired = 0.0
        self.freed_at = 0.0
        self.retired_at = 0.0
        self.queue: deque[list[float]] = deque()  # backlog chunks: [deferred at, records]
        self.queued = 0.0
        self.drained_to = 0.0

    def run(self) -> Result:
        events = [(0.0, lane.index) for lane in self.lanes if not lane.done]
        heapq.heapify(events)
        while events:
            t, index = heapq.heappop(events)
            self.drained_to = max(self.drained_to, t) if not self.queue else self.drained_to
            self.drain(t)
            after = self.step(self.lanes[index], t)
            if after is None:
                self.running -= 1
            else:
                heapq.heappush(events, (after, index))
        self.drain(math.inf)
        return self.finish()

    def finish(self) -> Result:
        result = self.result
        sessions = result.sessions
        result.ended = max(self.drained_to, self.freed_at, self.retired_at)
        result.sockets_closed = result.scratch_deleted = self.freed_at if self.seen >= sessions else None
        result.grants_retired = self.retired_at if self.retired >= sessions - 0.5 else None
        return result

    # -- the stream ----------------------------------------------------------------------------------------------

    def step(self, lane: _Lane, t: float) -> float | None:
        """One event of a lane; when it comes back (None: the lane is done)."""
        mapping = self.mapping
        trimmed = lane.first_younger(t, mapping.retention) - lane.position
        if trimmed > 0:
            self.result.trimmed += trimmed
            self.skip(lane, trimmed)
        if mapping.record_age >= 0:
            old = lane.first_younger(t, mapping.record_age) - lane.position
            if old > 0:
                self.to_on_failure(lane, t, old)
                return t + old / mapping.discard_rate
        if lane.done:
            return None
        arrived = lane.arrived(t)
        if arrived <= lane.position:
            return max(lane.arrival(lane.position), t + 1e-6)
        batch = min(mapping.batch_size, arrived - lane.position)
        if batch < mapping.batch_size and arrived < lane.count:
            full = min(
                lane.arrival(lane.position) + mapping.window, lane.arrival(lane.position + mapping.batch_size - 1)
            )
            if full > t:
                return full
        self.result.peak_iterator_age = max(self.result.peak_iterator_age, t - lane.arrival(lane.position))
        self.result.invocations += 1
        return self.invoke(lane, t, batch)

    def skip(self, lane: _Lane, count: int) -> None:
        lane.position += count
        lane.seen = max(lane.seen, lane.position)
        lane.attempts = 0

    def to_on_failure(self, lane: _Lane, t: float, count: int) -> None:
        self.result.peak_iterator_age = max(self.result.peak_iterator_age, t - lane.arrival(lane.position))
        self.result.on_failure_records += count - min(count, lane.ahead)
        lane.ahead = 0
        self.result.on_failure_messages += math.ceil(count / self.mapping.batch_size)
        self.skip(lane, count)

    def rates(self) -> tuple[float, float]:
        """A stream invocation's pace (sessions a second) and its share of the KMS quota, at this moment."""
        worker, quotas = self.worker, self.quotas
        users = max(1, self.running)
        pace = worker.rate
        for name, demand in worker.demand:
            if name != "kms":
                pace = min(pace, getattr(quotas, name) / (demand * users))
        drains = self.backlog.concurrency if self.backlog.enabled and self.queued > 0 else 0
        return pace, quotas.kms * worker.pacing / (users + drains)

    def invoke(self, lane: _Lane, t: float, batch: int) -> float:
        """Run one invocation of ``batch`` records from the lane's position; when it ends."""
        pace, grants = self.rates()
        start = t + self.worker.overhead
        usable = self.mapping.timeout - self.worker.margin - self.worker.overhead
        cleaned = min(batch, math.floor(pace * usable))  # sockets and scratch data freed in this invocation
        self.free(lane, cleaned, start + cleaned / pace)
        for name, demand in self.worker.demand:
            if name != "kms":
                self.result.used[name] += demand * batch
        if self.backlog.enabled:
            return self.invoke_deferring(lane, start, batch, pace, grants)
        effective = min(pace, grants)
        turns = math.floor(effective * usable)
        ahead = min(lane.ahead, batch)  # retired already: each costs a RetireGrant all the same (not found)
        self.result.used["kms"] += min(ahead, turns)
        if batch <= turns:
            self.retire(batch - ahead, start + batch / effective)
            lane.position, lane.ahead, lane.attempts = lane.position + batch, 0, 0
            return start + max(batch / pace, batch / effective)
        self.retire(max(0, turns - ahead), start + turns / effective)
        advance = math.floor(self.worker.in_order * turns)
        lane.position, lane.ahead = lane.position + advance, turns - advance
        lane.attempts += 1
        retries = self.mapping.retry_attempts
        if retries >= 0 and lane.attempts > retries:
            rest = batch - advance
            self.result.on_failure_records += rest - lane.ahead  # those already retired are not lost
            self.result.on_failure_messages += 1
            self.skip(lane, rest)
            lane.ahead = 0
        return t + self.mapping.timeout - self.worker.margin

    def invoke_deferring(self, lane: _Lane, start: float, batch: int, pace: float, grants: float) -> float:
        """With a backlog: the grants whose turn comes within QUOTA_WAIT_SECONDS are retired, the rest deferred."""
        work = batch / pace
        done = min(batch, math.floor(grants * (work + self.backlog.quota_wait)))
        deferred = batch - done
        end = start + max(work, done / grants if done else 0.0)
        end += math.ceil(deferred / SQS_BATCH) * self.worker.latency
        self.retire(done, start + max(work, done / grants if done else 0.0))
        if deferred:
            self.result.deferred += deferred
            self.queue.append([end, float(deferred)])
            self.queued += deferred
            self.result.peak_backlog = max(self.result.peak_backlog, round(self.queued))
        lane.position += batch
        lane.attempts = 0
        return end

    def free(self, lane: _Lane, cleaned: int, at: float) -> None:
        fresh = max(0, lane.position + cleaned - lane.seen)
        if fresh:
            lane.seen += fresh
            self.seen += fresh
            self.freed_at = max(self.freed_at, at)

    def retire(self, count: float, at: float) -> None:
        if count > 0:
            self.retired += count
            self.retired_at = max(self.retired_at, at)
            self.result.used["kms"] += count

    # -- the backlog ---------------------------------------------------------------------------------------------

    def drain(self, until: float) -> None:
        """Drain the backlog, oldest first, from where it was drained to up to ``until`` (inf: until empty)."""
        if not self.queue:
            self.drained_to = until if math.isfinite(until) else self.drained_to
            return
        total = self.quotas.kms * self.worker.pacing
        drains = self.backlog.concurrency
        rate = total * drains / (self.running + drains) if self.running else total
        now = self.drained_to
        while self.queue and now < until:
            deferred_at, count = self.queue[0]
            now = max(now, deferred_at)
            self.result.peak_backlog_age = max(self.result.peak_backlog_age, min(until, now) - deferred_at)
            if now - deferred_at > self.backlog.retention:  # past the queue's retention before its turn came
                self.result.backlog_lost += round(count)
                self.queue.popleft()
                self.queued -= count
                continue
            take = min(count, (until - now) * rate) if math.isfinite(until) else count
            now += take / rate
            self.queue[0][1] -= take
            self.queued -= take
            self.retire(take, now)
            self.result.used["dynamodb"] += take  # the drain's race-check read
            if self.queue[0][1] <= 1e-9:
                self.queue.popleft()
        self.drained_to = until if math.isfinite(until) else now


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
