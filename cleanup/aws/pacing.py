"""Pacing every AWS request: bounded by the caller's deadline, timed out per operation, and backing off under load.

Hooked into each botocore client (``Pacer.attach``), so every HTTP attempt passes through it, botocore's own retries
included:

* **Deadline.** ``calls.call`` binds the caller's deadline for the duration of a call. An attempt starts only when
  there is time for a connection and a minimal read; its read timeout is cut to the time left after a connection
  (whose own timeout is at most CONNECT_TIMEOUT_SECONDS); and when a failed
  attempt leaves too little time for botocore's backoff and another try, the call ends there (``OutOfTimeError``,
  transient) instead of sleeping past the deadline. No request can outlive a Lambda invocation.
* **Timeouts per operation.** Listings and DeleteObjects (``BULK_OPERATIONS``) may take seconds on a big or versioned
  bucket and get BULK_TIMEOUT_SECONDS; everything else (DeleteConnection, RetireGrant, BatchGetItem, ...) gets
  HTTP_TIMEOUT_SECONDS.
* **Concurrency that backs off.** Each service has a ``Gate``: at most ``limit`` attempts in flight, shared by every
  thread and client of the process. A timeout halves the limit (once per round of attempts in flight,
  additive-increase/multiplicative-decrease as in TCP); each round of successes raises it by one, back up to
  MAX_CONCURRENCY. A slow dependency thus slows the worker down instead of failing its records.
* **A rate learnt from throttling.** Each gate also has a ``Rate``: unlimited until the service throttles, then
  just under what the service accepted over the last second (the rate its quota leaves us), and requests are
  spaced to it, shared by every thread of the process. Each second without throttling raises it by a tenth, so it
  finds a raised quota again, and it is dropped once far above anything asked. A throttling dependency thus gets
  requests at about the rate it allows, not retries. A request whose turn would come after the caller's deadline is
  not started (``OutOfTimeError``): nothing waits past the deadline for a turn. Throttling is not also taken out on
  concurrency: a quota is on requests a second, and fewer in flight would only lower the rate below it.
"""

from __future__ import annotations

import math
import threading
import time
from contextvars import ContextVar
from typing import Any

from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError

from cleanup.aws.aws_errors import THROTTLING_CODES, is_transient_code
from cleanup.aws.rate import Rate
from cleanup.exceptions import OutOfTimeError
from cleanup.telemetry import log
from schemas.settings import Settings

BULK_OPERATIONS = frozenset({"ListObjectsV2", "ListObjectVersions", "DeleteObjects"})
CONNECT_TIMEOUT_SECONDS = 0.5  # in-region endpoints connect in milliseconds; a slow connect is retried (botocore)
MIN_READ_SECONDS = 0.25  # an attempt with less time than this to answer is not worth starting
BOTOCORE_MAX_BACKOFF_SECONDS = 20.0  # botocore standard mode: rand * min(2 ** (attempt - 1), 20) for throttling
RETRY_AFTER_MAX_SECONDS = 5.0  # and up to this much more when the answer carries x-amz-retry-after
_SLOT = "cleanup.aws.pacing.slot"
_LONG_POLL = "cleanup.aws.pacing.long_poll"

deadline_var: ContextVar[Any] = ContextVar("cleanup_deadline", default=None)
"""The deadline of the call in progress on this thread (a ``cleanup.aws.retry.Deadline``), bound by ``calls.call``."""


class Gate:
    """Adaptive concurrency for one service (additive increase, multiplicative decrease), and its rate."""

    def __init__(self, ceiling: int, service: str = "") -> None:
        self.rate = Rate(service)
        self.ceiling = ceiling
        self.limit = ceiling
        self.in_flight = 0
        self.round = 0  # bumped at each decrease: trouble from attempts of an earlier round is not counted twice
        self._successes = 0
        self._condition = threading.Condition()

    def acquire(self, timeout: float | None) -> int | None:
        """Wait for a slot (at most ``timeout`` seconds, None: as long as it takes); the round it was taken in, or
        None if none came free in time."""
        with self._condition:
            if self.in_flight >= self.limit:  # else a slot is free: no need for the waiting machinery
                wait = None if timeout is None else max(0.0, timeout)
                if not self._condition.wait_for(lambda: self.in_flight < self.limit, timeout=wait):
                    return None
            self.in_flight += 1
            return self.round

    def release(self, taken_in: int, *, trouble: bool, success: bool) -> None:
        """Give a slot back, saying how its attempt went."""
        with self._condition:
            self.in_flight -= 1
            if trouble and taken_in == self.round:
                self.limit = max(1, self.limit // 2)
                self.round += 1
                self._successes = 0
            elif success and self.limit < self.ceiling:
                self._successes += 1
                if self._successes >= self.limit:
                    self.limit += 1
                    self._successes = 0
            self._condition.notify_all()


class Pacer:
    """The process's gates and timeouts, attached to every client it makes."""

    def __init__(self, settings: Settings) -> None:
        self.connect_timeout = min(CONNECT_TIMEOUT_SECONDS, settings.http_timeout_seconds)
        self.short_timeout = settings.http_timeout_seconds
        self.bulk_timeout = settings.bulk_timeout_seconds
        self._ceiling = settings.max_concurrency
        self.quota_wait = settings.quota_wait_seconds  # with a backlog: how long a request waits for a rate's turn
        self._gates: dict[str, Gate] = {}
        self._lock = threading.Lock()

    def gate(self, service: str) -> Gate:
        gate = self._gates.get(service)
        if gate is None:
            with self._lock:
                gate = self._gates.get(service)
                if gate is None:
                    gate = self._gates[service] = Gate(self._ceiling, service)
        return gate

    def attach(self, client: Any) -> None:
        """Pace every request ``client`` sends."""
        client.meta.events.register("before-parameter-build", _note_long_poll)
        client.meta.events.register("before-send", self._before_send)
        client.meta.events.register_first("needs-retry", self._after_attempt)

    def _before_send(self, request: Any, event_name: str, **_: Any) -> None:
        service, operation = event_name.split(".")[1:3]
        deadline = deadline_var.get()
        remaining = math.inf if deadline is None else deadline.remaining()
        spare = remaining - self.connect_timeout - MIN_READ_SECONDS
        if spare <= 0:
            raise OutOfTimeError(f"{operation}: not started, {max(0.0, remaining):.2f} s left before the deadline")
        gate = self.gate(service)
        started = time.monotonic()
        latest = spare if self.quota_wait is None else min(spare, self.quota_wait)
        turn = gate.rate.reserve(started + latest)
        if turn is None:
            raise OutOfTimeError(f"{operation}: {service} accepts {gate.rate.limit:.1f}/s, no turn in {latest:.2f} s")
        if turn > started:
            time.sleep(turn - started)
        taken_in = gate.acquire(None if math.isinf(spare) else spare - (time.monotonic() - started))
        if taken_in is None:
            raise OutOfTimeError(f"{operation}: no {service} capacity came free before the deadline")
        request.context[_SLOT] = (gate, taken_in, time.monotonic())
        limit = self.bulk_timeout if operation in BULK_OPERATIONS else self.short_timeout
        limit += request.context.get(_LONG_POLL, 0)  # a long poll (SQS WaitTimeSeconds) answers at its end
        request.context["read_timeout"] = min(limit, remaining - (time.monotonic() - started) - self.connect_timeout)

    def _after_attempt(
        self, response: Any, attempts: int, caught_exception: Any, request_dict: dict[str, Any], **kwargs: Any
    ) -> None:
        if isinstance(caught_exception, OutOfTimeError):
            raise caught_exception  # raised by _before_send: nothing was sent
        slot = request_dict.get("context", {}).pop(_SLOT, None)
        throttled = _throttled(response)
        failed = caught_exception is not None or _status(response) >= 400
        if slot is not None:
            gate, taken_in, sent = slot
            gate.release(taken_in, trouble=_timed_out(caught_exception), success=not failed)
            _learn_rate(gate, sent, throttled=throttled, answered=response is not None)
        deadline = deadline_var.get()
        # Only an answer botocore would try again can run out of time; any other (a 410 Gone, access denied, a bad
        # request) is the call's answer, and is returned as such however little time is left.
        retryable = (
            caught_exception is not None or throttled or is_transient_code(_error_code(response), _status(response))
        )
        if retryable and deadline is not None:
            backoff = min(2.0 ** (attempts - 1), BOTOCORE_MAX_BACKOFF_SECONDS) + _retry_after(response)
            if deadline.remaining() < backoff + self.connect_timeout + MIN_READ_SECONDS:
                operation = kwargs["event_name"].rsplit(".", 1)[-1]
                why = caught_exception or _error_code(response) or _status(response)
                raise OutOfTimeError(f"{operation}: {why}; no time left for another attempt before the deadline")


def _note_long_poll(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    wait = params.get("WaitTimeSeconds")
    if isinstance(wait, int) and wait > 0:
        context[_LONG_POLL] = wait


def _learn_rate(gate: Gate, sent: float, *, throttled: bool, answered: bool) -> None:
    if not answered:  # a timeout or a reset says nothing about the rate
        return
    limit = gate.rate.answered(sent, throttled=throttled, outstanding=gate.in_flight)
    if limit is not None:
        log.warning("throttled: pacing requests", extra={"awsService": gate.rate.service, "requestsPerSecond": limit})


def _status(response: Any) -> int:
    if not response:
        return 0
    return int(getattr(response[0], "status_code", 0) or 0)


def _error_code(response: Any) -> str:
    if not response:
        return ""
    return str(response[1].get("Error", {}).get("Code", ""))


def _retry_after(response: Any) -> float:
    if response and "x-amz-retry-after" in response[0].headers:
        return RETRY_AFTER_MAX_SECONDS
    return 0.0


def _timed_out(exc: Any) -> bool:
    return isinstance(exc, ReadTimeoutError | ConnectTimeoutError)


def _throttled(response: Any) -> bool:
    return _status(response) in (429, 503) or _error_code(response) in THROTTLING_CODES
