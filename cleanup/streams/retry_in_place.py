"""Retrying a shard's failed records in place: the rules every consumer that keeps its own position follows.

Lambda's event source mapping retries a batch itself. The stream poller and the KCL record processor checkpoint
their shards, so they retry in place, and both do it here, the same way:

* Records are told apart by their id (``sequence_number``: the sequence number, with the sub-sequence number of a
  record the KCL de-aggregated, ``schemas.records.record_id``), never by the stream's sequence number alone.
* A batch is attempted again and again; each attempt runs, in order, only the records not yet done (clean, skipped
  or dead-lettered).
* The checkpoint may move up to the record before the first one not done, never past it.
* A record is given up when it failed permanently on its MAX_RECORD_ATTEMPTS-th try, or failed, whatever the error,
  MAX_RECORD_RETRY_SECONDS or more after its first try (on the consumer's clock): no shard waits for ever on one
  record. A record given up goes to the dead-letter queue, with its last error and its number of tries, and the
  shard moves on. With no queue to take it, it stays where it is and holds the shard ("stuck"): an ERROR line and
  ``RecordsStuck`` on every attempt.
* Between two attempts the shard waits ``Backoff``, but never past the moment its oldest failing record is due to be
  given up.
* A dry run retries nothing and gives nothing up: every record is tried once, its failure reported, and the consumer
  moves on in memory. Its adapter writes no checkpoint either (``may_move_past``), so an enforce run starts from the
  same place and cleans everything.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tenacity import RetryCallState
from tenacity.wait import wait_base

from cleanup.core.pipeline import Incoming
from cleanup.deadline import Deadline
from cleanup.queues.reporting import run_batch
from cleanup.runtime import Runtime
from cleanup.telemetry import log
from schemas.outcomes import Outcome
from schemas.settings import CleanupMode, Settings

BACKOFF_MAX_SECONDS = 60.0


def may_move_past(settings: Settings) -> bool:
    """Whether a consumer may move past records for good (checkpoint, dead-letter): never in a dry run."""
    return settings.cleanup_mode is not CleanupMode.DRY_RUN


class Backoff(wait_base):
    """The consumers' one backoff: from a quarter of RETRY_MAX_WAIT_SECONDS, doubling, capped at 60 s.

    No jitter: a KCL processor owns one shard, and the poller's shards take turns on one thread. Also a tenacity wait
    strategy, for the retries of a checkpoint.
    """

    def __init__(self, settings: Settings) -> None:
        self.base = settings.retry_max_wait_seconds / 4

    def seconds(self, failures: int) -> float:
        """The wait after the ``failures``-th failure in a row."""
        return float(min(BACKOFF_MAX_SECONDS, self.base * 2 ** max(0, failures - 1)))

    def __call__(self, retry_state: RetryCallState) -> float:
        return self.seconds(retry_state.attempt_number)


@dataclass
class _Tries:
    first_at: float
    count: int = 0


@dataclass(frozen=True)
class Attempt:
    """What one attempt at a batch did."""

    outcomes: list[Outcome]
    """The outcomes of the records run this time, in stream order."""
    checkpoint: int | None
    """Index of the record the checkpoint may now move to (everything up to it is done); None: it does not move."""


class InPlaceBatch:
    """One batch of a shard's records, attempted until each is done or given up (see the module's rules)."""

    def __init__(
        self, records: Sequence[Incoming], runtime: Runtime, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.records = list(records)
        self.runtime = runtime
        self.failures = 0
        """Attempts in a row that left records not done."""
        self.stuck = False
        """A record given up, with no dead-letter queue to take it, holds the shard."""
        self._clock = clock
        self._backoff = Backoff(runtime.settings)
        self._done: set[str] = set()
        self._tries: dict[str, _Tries] = {}
        self._earlier: dict[str, float] = {}  # first tries known from before this batch (``remember``)
        self._clean = 0  # records[:_clean] are done
        self._checkpointed = 0  # records[:_checkpointed] were handed out as a checkpoint

    @property
    def finished(self) -> bool:
        """Every record is done: the shard may read on."""
        return self._clean == len(self.records)

    @property
    def waiting(self) -> list[str]:
        """Ids of the records not done yet."""
        return [r.sequence_number for r in self.records[self._clean :] if r.sequence_number not in self._done]

    @property
    def failing_since(self) -> dict[str, float]:
        """The records tried and not done yet, each with the time of its first try (on the batch's clock)."""
        return {number: tries.first_at for number, tries in self._tries.items()}

    def remember(self, first_tried: Mapping[str, float]) -> None:
        """Times of first tries made before this batch (by a process that came before, on the same clock): the
        give-up clock of those records runs from there, never from a later moment."""
        for number, at in first_tried.items():
            tries = self._tries.get(number)
            if tries is not None:
                tries.first_at = min(tries.first_at, at)
            else:
                self._earlier[number] = min(at, self._earlier.get(number, at))

    def attempt(self, deadline: Deadline | None = None, **where: str) -> Attempt:
        """Run the records not done yet, once; dead-letter those given up; say so when records are left failing.

        Args:
            deadline: when the attempt must end by.
            where: names the shard in the log lines (e.g. ``shardId``).
        """
        todo = [r for r in self.records[self._clean :] if r.sequence_number not in self._done]
        started = self._clock()
        for record in todo:
            first_at = self._earlier.pop(record.sequence_number, started)
            self._tries.setdefault(record.sequence_number, _Tries(first_at=first_at)).count += 1
        counts = {number: tries.count for number, tries in self._tries.items()}
        consuming = may_move_past(self.runtime.settings)
        give_up = self._given_up if consuming else _never
        outcomes = run_batch(todo, self.runtime, deadline, attempts=counts, give_up=give_up)
        failed = [o for o in outcomes if o.failed and not o.dead_lettered]
        if consuming:
            self._done |= {o.sequence_number for o in outcomes if not o.failed or o.dead_lettered}
            self._announce(failed, where)
        else:
            self._done |= {o.sequence_number for o in outcomes}
            _report_dry_run(failed, where)
        self.failures = self.failures + 1 if failed and consuming else 0
        while self._clean < len(self.records) and self.records[self._clean].sequence_number in self._done:
            self._clean += 1
        moved = self._clean > self._checkpointed
        self._checkpointed = self._clean
        waiting = set(self.waiting)
        self._tries = {number: tries for number, tries in self._tries.items() if number in waiting}
        self.runtime.metrics.flush()
        return Attempt(outcomes, self._clean - 1 if moved else None)

    def wait(self) -> float:
        """Seconds before the next attempt: the backoff, cut short when a failing record is due to be given up."""
        now = self._clock()
        due = (t.first_at + self.runtime.settings.max_record_retry_seconds for t in self._tries.values())
        return min([self._backoff.seconds(self.failures)] + [at - now for at in due if at > now])

    def _given_up(self, outcome: Outcome) -> bool:
        """The give-up rule: permanent on its MAX_RECORD_ATTEMPTS-th try, or failing MAX_RECORD_RETRY_SECONDS on."""
        settings = self.runtime.settings
        tries = self._tries[outcome.sequence_number]
        if outcome.permanent and tries.count >= settings.max_record_attempts:
            return True
        return self._clock() - tries.first_at >= settings.max_record_retry_seconds

    def _announce(self, failed: list[Outcome], where: dict[str, str]) -> None:
        """Say, on every attempt, that records are retried in place (``RecordsRetried``), or stuck."""
        self.stuck = False
        if not failed:
            return
        settings = self.runtime.settings
        stuck = [o for o in failed if self._given_up(o)] if not settings.dead_letter_queue_url else []
        first = failed[0]
        tries = self._tries[first.sequence_number]
        line: dict[str, Any] = {
            **where,
            "sequenceNumber": first.sequence_number,
            "attempt": tries.count,
            "maxAttempts": settings.max_record_attempts,
            "failingSeconds": round(self._clock() - tries.first_at, 3),
            "maxRetrySeconds": settings.max_record_retry_seconds,
            "failing": len(failed),
            "error": first.error,
        }
        self.runtime.metrics.count("RecordsRetried", amount=len(failed))
        if stuck:
            self.stuck = True
            self.runtime.metrics.count("RecordsStuck", amount=len(stuck))
            line["stuck"] = [o.sequence_number for o in stuck]
            log.error("records keep failing and DEAD_LETTER_QUEUE_URL is not set: the shard waits on them", extra=line)
            return
        log.warning("records failed; the shard retries them in place before going on", extra=line)


def _never(_outcome: Outcome) -> bool:
    return False


def _report_dry_run(failed: list[Outcome], where: dict[str, str]) -> None:
    if failed:
        log.warning(
            "dry run: records failed; not retried, and read again by the next enforce run",
            extra={**where, "sequenceNumbers": [o.sequence_number for o in failed]},
        )
