"""The capacity model's engine: lanes of invocations in time order, and the backlog's drain between them.

Each lane (a shard, or a ParallelizationFactor slice of it) is an event: at its time it drops what the stream no
longer holds, sends what is too old to the on-failure queue, waits for a batch, or runs one invocation and comes back
when that invocation ends. The backlog drains as a fluid between events, at its share of the KMS quota, oldest
message first. Quotas are shared equally by whatever uses them at that moment (every process learns its share from
its own throttling, and together they keep to the quota: ``Worker.pacing``).
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from benchmarks.capacity_model import Backlog, Expiry, Mapping, Quotas, Result, Worker, _Lane

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
