"""Pacing every AWS request: bounded by the caller's deadline, timed out per operation, and backing off under load.

Hooked into each botocore client (``Pacer.attach``), so every HTTP attempt of a call made through ``calls.call``
passes through it, botocore's own retries included:

* **One scope per call.** ``calls.call`` opens a ``paced`` scope around the whole API call. Each attempt takes a
  concurrency slot in ``before-send`` and gives it back in ``needs-retry`` (so a backoff holds none), and the scope
  gives back whatever is still held when the call ends: an exception raised between the two hooks (botocore's parser
  on a 502 whose body is ``"Bad Gateway"``, a hook) skips ``needs-retry`` but not the scope's end. Per-attempt state
  lives in the scope.
* **Every wait is bounded.** A turn or a slot is waited for until the caller's deadline, and never longer than
  CALL_WAIT_SECONDS (the bound where there is no deadline: poller, replay, redrive, sweeper, KCL).
* **Deadline.** ``calls.call`` binds the caller's deadline for the duration of a call. An attempt starts only when
  there is time for a connection and a minimal read; its read timeout is cut to the time left after a connection
  (whose own timeout is at most CONNECT_TIMEOUT_SECONDS); and when a failed
  attempt leaves too little time for botocore's backoff and another try, the call ends there (``OutOfTimeError``,
  transient) instead of sleeping past the deadline. No request can outlive a Lambda invocation.
* **Timeouts per operation.** Listings and DeleteObjects (``BULK_OPERATIONS``) may take seconds on a big or versioned
  bucket and get BULK_TIMEOUT_SECONDS; everything else (DeleteConnection, RetireGrant, BatchGetItem, ...) gets
  HTTP_TIMEOUT_SECONDS.
* **Quotas apart.** A call with a quota of its own (``RATED_APART``: KMS's ListGrants, GenerateMac, VerifyMac) has a
  gate of its own, so that it neither waits behind nor inflates the rate learnt for its service's other calls.
* **Control calls apart.** Calls that name only the checkpoint table (the stream lease's renewals, checkpoints) have
  gates of their own (``dynamodb-control``): a session table throttling under a flood of race reads cannot make a
  lease renewal wait past its term behind them. DynamoDB's quotas are per table anyway.
* **Concurrency that backs off.** Each service has a ``Lane`` (its own way through the pacer): at most ``limit``
  attempts in flight, shared by every thread and client of the process. It starts at SLOW_START and each success raises
  it by one (doubling it every round, a few round trips to MAX_CONCURRENCY), until the first timeout or throttling
  answer: a new process's first burst to a service that throttles is a few requests, not MAX_CONCURRENCY of them
  answered "throttled" before the rate can be cut, and it does not double again while the rate is learnt (throttling
  answers come back at once, and each frees its slot for another request into the spent quota). A throttling answer does
  not lower the limit. A timeout halves the limit (once per round of attempts in flight,
  additive-increase/multiplicative-decrease as in TCP); each round of successes raises it by one, back up to
  MAX_CONCURRENCY. A slow dependency thus slows the worker down instead of failing its records.
* **A rate learnt from throttling.** Each lane also has a ``Rate`` (``cleanup.aws.rate``, whose docstring states the
  law): unlimited until the service throttles more than a background share, then aimed where a quota would throttle a
  small share over it, and requests are spaced to it, shared by every thread of the process. It grows while requests
  wait for their turns and fewer are throttled than that, so it finds a raised quota again; scattered throttling,
  which does not come down with the rate, is told from a quota and puts the limit back. A request waiting for a turn
  given before the limit changed takes a new one at once (``_wait_turn``), and so does one given its turn before a
  decrease that waits for a slot: the queue, for turns or for slots, goes on neither at a refused rate nor at one since
  grown past (the growth would be judged on rounds still sent at the old pace). A throttling dependency thus gets
  requests at about the rate it allows, not retries. A request whose turn would come after the caller's deadline is
  not started (``OutOfTimeError``): nothing waits past the deadline for a turn. Throttling is not also taken out on
  concurrency: a quota is on requests a second, and fewer in flight would only lower the rate below it.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from botocore.exceptions import BotoCoreError, ConnectTimeoutError, ReadTimeoutError

from cleanup.aws.aws_errors import THROTTLING_CODES, is_transient_code, translate
from cleanup.aws.permits import SendCheck
from cleanup.aws.rate import Rate
from cleanup.exceptions import CleanupError, OutOfTimeError, ThrottledError, TransientError
from cleanup.telemetry import log
from schemas.settings import Settings

BULK_OPERATIONS = frozenset({"ListObjectsV2", "ListObjectVersions", "DeleteObjects"})
RATED_APART = frozenset({"ListGrants", "GenerateMac", "VerifyMac"})
"""Calls with a quota of their own, apart from the rest of their service's: each gets a gate of its own (KMS's
ListGrants, 100 a second, must neither wait behind RetireGrant's learnt rate nor raise it past RetireGrant's quota;
nor must the tags of the messages deferred to the backlog, GenerateMac, a cryptographic operation with a quota of its
own: under a low RetireGrant quota, no record could be deferred)."""
CONNECT_TIMEOUT_SECONDS = 0.5  # in-region endpoints connect in milliseconds; a slow connect is retried (botocore)
MIN_READ_SECONDS = 0.25  # an attempt with less time than this to answer is not worth starting
BOTOCORE_MAX_BACKOFF_SECONDS = 20.0  # botocore standard mode: rand * min(2 ** (attempt - 1), 20) for throttling
RETRY_AFTER_MAX_SECONDS = 5.0  # and up to this much more when the answer carries x-amz-retry-after
SLOW_START = 4  # attempts in flight a service's gate starts at
NO_TURN_POLL_SECONDS = 1.0  # a call with no turn in CALL_WAIT_SECONDS asks again this often until that wait is over


class Lane:
    """Adaptive concurrency for one service (additive increase, multiplicative decrease), and its rate."""

    def __init__(self, ceiling: int, service: str = "") -> None:
        self.rate = Rate(service)
        self.ceiling = ceiling
        self.limit = min(ceiling, SLOW_START)
        self._slow_start = True  # until the first trouble or throttling: each success raises the limit by one
        self.in_flight = 0
        self.throttled_by = ""  # the last throttling answer's error code (or HTTP status): why the rate is what it is
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

    def release(self, taken_in: int, *, trouble: bool, success: bool, throttled: bool = False) -> None:
        """Give a slot back, saying how its attempt went (``throttled``: the answer said so)."""
        with self._condition:
            self.in_flight -= 1
            if throttled:  # the end of the slow start, not of the limit: the rate, not concurrency, meets a quota
                self._slow_start = False
            if trouble and taken_in == self.round:
                self.limit = max(1, self.limit // 2)
                self.round += 1
                self._successes = 0
                self._slow_start = False
            elif success and self._slow_start and self.limit < self.ceiling:
                self.limit += 1
            elif success and self.limit < self.ceiling:
                self._successes += 1
                if self._successes >= self.limit:
                    self.limit += 1
                    self._successes = 0
            self._condition.notify_all()


def own_quota(gate: str) -> bool:
    """Whether the gate named ``gate`` paces a service's own quota: not a call rated apart (``kms-GenerateMac``), nor
    control calls (``dynamodb-control``)."""
    return gate.rsplit("-", 1)[-1] not in {"control", *RATED_APART}


class CallScope:
    """What one API call holds of the pacer: its deadline, and the slot of its attempt in flight, if any.

    ``paced`` gives the slot back when the call ends, however it ends: botocore's parser raising on a garbled answer,
    a hook raising, or anything else between the hook that takes the slot and the one that gives it back.
    """

    def __init__(self, deadline: Any) -> None:
        self.deadline = deadline
        self.long_poll = 0
        self.tables: frozenset[str] = frozenset()  # the DynamoDB tables the call names
        self._attempt: tuple[Lane, int, float] | None = None  # gate, round taken in, when sent

    def hold(self, gate: Lane, taken_in: int) -> None:
        self.give_back()  # a slot never outlives its attempt, even one that ended without a needs-retry
        self._attempt = (gate, taken_in, time.monotonic())

    def give_back(
        self, *, trouble: bool = False, success: bool = False, throttled: bool = False
    ) -> tuple[Lane, float] | None:
        """Give the attempt's slot back (a no-op if none is held); its gate and when it was sent."""
        attempt, self._attempt = self._attempt, None
        if attempt is None:
            return None
        gate, taken_in, sent = attempt
        gate.release(taken_in, trouble=trouble, success=success, throttled=throttled)
        return gate, sent


_scope_var: ContextVar[CallScope | None] = ContextVar("cleanup_call_scope", default=None)


@contextmanager
def paced(deadline: Any) -> Iterator[CallScope]:
    """The scope of one API call made on this thread: its attempts are paced within ``deadline`` (a
    ``cleanup.deadline.Deadline``, None: none), and whatever the call holds is given back when the scope ends."""
    scope = CallScope(deadline)
    token = _scope_var.set(scope)
    try:
        yield scope
    finally:
        scope.give_back()
        _scope_var.reset(token)


class Pacer:
    """The process's gates and timeouts, attached to every client it makes."""

    def __init__(self, settings: Settings) -> None:
        self.connect_timeout = min(CONNECT_TIMEOUT_SECONDS, settings.http_timeout_seconds)
        self.short_timeout = settings.http_timeout_seconds
        self.bulk_timeout = settings.bulk_timeout_seconds
        self.max_wait = settings.call_wait_seconds
        self._control_tables = frozenset({settings.checkpoint_table})
        self._ceiling = settings.max_concurrency
        self.quota_wait = settings.quota_wait_seconds  # with a backlog: how long a request waits for a rate's turn
        self.check = SendCheck(settings.fence_read_max_age_seconds)
        self._gates: dict[str, Lane] = {}
        self._lock = threading.Lock()

    def gate(self, service: str) -> Lane:
        gate = self._gates.get(service)
        if gate is None:
            with self._lock:
                gate = self._gates.get(service)
                if gate is None:
                    gate = self._gates[service] = Lane(self._ceiling, service)
        return gate

    def learnt(self) -> dict[str, float]:
        """The limits learnt for each service's own quota (not the gates of calls rated apart, nor control calls):
        what a process taking over this one's work may start at (``seed``)."""
        with self._lock:
            gates = list(self._gates.items())
        return {
            name: round(limit, 3) for name, gate in gates if own_quota(name) and (limit := gate.rate.limit) is not None
        }

    def seed(self, paces: Mapping[str, float]) -> None:
        """Start each named service's rate at the pace another process learnt for it (``learnt``), where this process
        has learnt none of its own (``Rate.seed``)."""
        for name, pace in paces.items():
            if self.gate(name).rate.seed(pace):
                log.info("pacing from the sender's learnt rate", extra={"awsService": name, "requestsPerSecond": pace})

    def attach(self, client: Any) -> None:
        """Pace every request ``client`` sends within a ``paced`` scope (``calls.call``); others are not paced."""
        client.meta.events.register("before-parameter-build", _note_params)
        client.meta.events.register("before-parameter-build", self.check.note_targets)
        client.meta.events.register("before-send", self._before_send)
        client.meta.events.register_first("needs-retry", self._after_attempt)

    def _before_send(self, request: Any, event_name: str, **_: Any) -> None:
        scope = _scope_var.get()
        service, operation = event_name.split(".")[1:3]
        if scope is None:  # not paced, but a freeing call is checked wherever it comes from
            self.check.check_request(service, operation, request, None)
            return
        remaining = math.inf if scope.deadline is None else scope.deadline.remaining()
        spare = remaining - self.connect_timeout - MIN_READ_SECONDS
        if spare <= 0:
            raise OutOfTimeError(f"{operation}: not started, {max(0.0, remaining):.2f} s left before the deadline")
        control = scope.tables and scope.tables <= self._control_tables
        gate = self.gate(
            f"{service}-control" if control else f"{service}-{operation}" if operation in RATED_APART else service
        )
        started = time.monotonic()
        patience = min(spare, self.max_wait)
        # QUOTA_WAIT_SECONDS bounds the wait for a throttling service's turn only: a slot frees as soon as an
        # attempt in flight is answered, so the wait for one is bounded by the deadline alone, like any other.
        quota_wait = math.inf if self.quota_wait is None else self.quota_wait
        # Only CALL_WAIT_SECONDS bounding it, a call with no turn waits that long before it fails: failing at once,
        # its caller's next call (the next record's) would find none either, and callers would spin.
        held = quota_wait >= patience and spare > self.max_wait
        while True:
            turn = _wait_turn(gate.rate, started + min(patience, quota_wait), held=held)
            if turn is None:
                why = f" (throttled: {gate.throttled_by})" if gate.throttled_by else ""
                accepts = f"{service} accepts {gate.rate.limit or 0:.1f}/s{why}"
                if quota_wait < patience:  # with a backlog: defer, don't wait
                    raise OutOfTimeError(f"{operation}: {accepts}, no turn in {quota_wait:.2f} s")
                raise self._no_turn(operation, f"{accepts}, no turn", spare)
            taken_in = gate.acquire(patience - (time.monotonic() - started))
            if taken_in is None:
                raise self._no_turn(operation, f"no {service} capacity came free", spare)
            if gate.rate.current(turn):
                break
            gate.release(taken_in, trouble=False, success=False)  # the rate was cut while waiting for the slot
        scope.hold(gate, taken_in)
        # The permit of a freeing call is asked now, after every wait, right before the send (the slot held is given
        # back by the scope if it is refused).
        self.check.check_request(service, operation, request, scope.deadline)
        limit = self.bulk_timeout if operation in BULK_OPERATIONS else self.short_timeout
        limit += scope.long_poll  # a long poll (SQS WaitTimeSeconds) answers at its end
        left = math.inf if scope.deadline is None else scope.deadline.remaining()
        request.context["read_timeout"] = min(limit, left - self.connect_timeout)

    def _no_turn(self, operation: str, why: str, spare: float) -> TransientError:
        """An attempt found no turn or slot in time: out of time when the deadline was the bound, else transient."""
        if spare <= self.max_wait:
            return OutOfTimeError(f"{operation}: {why} before the deadline")
        return TransientError(f"{operation}: {why} within CALL_WAIT_SECONDS ({self.max_wait:g} s)")

    def _after_attempt(self, response: Any, attempts: int, caught_exception: Any, **kwargs: Any) -> None:
        if isinstance(caught_exception, CleanupError):
            raise caught_exception  # raised by _before_send: nothing was sent
        scope = _scope_var.get()
        if scope is None:
            return
        throttled = _throttled(response)
        failed = caught_exception is not None or _status(response) >= 400
        attempt = scope.give_back(trouble=_timed_out(caught_exception), success=not failed, throttled=throttled)
        if attempt is not None:
            if throttled:
                attempt[0].throttled_by = _error_code(response) or str(_status(response))
            _learn_rate(*attempt, throttled=throttled, answered=response is not None)
        # Only an answer botocore would try again can run out of time; any other (a 410 Gone, access denied, a bad
        # request) is the call's answer, and is returned as such however little time is left.
        retryable = (
            caught_exception is not None or throttled or is_transient_code(_error_code(response), _status(response))
        )
        service, operation = kwargs["event_name"].split(".")[1:3]
        if retryable and self.check.frees(service, operation):
            # Not sent again by botocore on the read that allowed it: the step is tried again (``call_with_retry``),
            # and its next attempt reads the live item first (``cleanup.core.fence``).
            if isinstance(caught_exception, BotoCoreError):  # as the call would say it (a host that does not
                raise translate(caught_exception, operation) from caught_exception  # resolve is no passing trouble)
            why = caught_exception or _error_code(response) or _status(response)
            error = ThrottledError if throttled else TransientError
            raise error(f"{operation}: {why}; tried again after a fresh read of the live item")
        if retryable and scope.deadline is not None:
            backoff = min(2.0 ** (attempts - 1), BOTOCORE_MAX_BACKOFF_SECONDS) + _retry_after(response)
            if scope.deadline.remaining() < backoff + self.connect_timeout + MIN_READ_SECONDS:
                why = caught_exception or _error_code(response) or _status(response)
                raise OutOfTimeError(f"{operation}: {why}; no time left for another attempt before the deadline")


def _wait_turn(rate: Rate, latest: float, *, held: bool = False) -> float | None:
    """Wait for a turn of ``rate`` starting by ``latest`` (monotonic): when it was reserved, or None when there is
    none: at once, or, ``held``, once ``latest`` has come (asking again every NO_TURN_POLL_SECONDS, as the limit may
    grow). A turn given before the limit changed is reserved again as soon as it changes (``Rate.wait``): it was
    spaced for a rate the service has since refused, or one since grown past, and the requests queued behind it would
    go on at that rate (so is one still waiting for a slot when the rate is cut: ``Pacer._before_send``)."""
    while True:
        reserved = time.monotonic()
        turn = rate.reserve(latest)
        if turn is None:
            if not held or reserved >= latest:
                return None
            time.sleep(min(NO_TURN_POLL_SECONDS, latest - reserved))
            continue
        if rate.wait(reserved, turn):
            return reserved


def _note_params(params: dict[str, Any], **_: Any) -> None:
    scope = _scope_var.get()
    if scope is None:
        return
    wait = params.get("WaitTimeSeconds")
    if isinstance(wait, int) and wait > 0:
        scope.long_poll = wait
    scope.tables = _tables(params)


def _tables(params: dict[str, Any]) -> frozenset[str]:
    """The DynamoDB tables a request names (TableName, a batch's RequestItems, a transaction's items)."""
    named = {params["TableName"]} if isinstance(params.get("TableName"), str) else set()
    named |= set(params.get("RequestItems") or {})
    for item in params.get("TransactItems") or ():
        named |= {action["TableName"] for action in item.values() if "TableName" in action}
    return frozenset(named)


def _learn_rate(gate: Lane, sent: float, *, throttled: bool, answered: bool) -> None:
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
