"""The capacity model's inputs and outputs: how long a mass expiry takes to clean, and what it loses.

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

The engine is ``benchmarks.capacity_sim``; ``python -m benchmarks.capacity --sessions 1000000`` prints a table.
"""

from __future__ import annotations

import math
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
    # record: records throttled while the learnt rate probes above the quota (it grows 5% a second) fail out of
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
