"""Pacing gives back what it takes on every path: a call that raises anywhere between the slot's take and its
give-back (a hook, botocore's parser on a garbled 502, botocore without a request context) leaves the gate as it found
it, and the next calls still run. Every wait for a slot has a bound, with or without a deadline. A turn given before
a cut is taken again, even after the wait for a slot; a gate starts with a few slots, and grows fast while answered,
until a timeout or a throttling answer."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest

from cleanup.aws.calls import call
from cleanup.aws.pacing import SLOW_START, Lane
from cleanup.deadline import Deadline
from cleanup.exceptions import OutOfTimeError, TransientError
from cleanup.queues.integrity import seal
from schemas.settings import Settings
from tests.proxy import GARBLED, FaultPlan, FaultProxy
from tests.scenarios.helpers import ProxiedClients
from tests.stack import SessionStack, open_gate

SLOTS = 2  # MAX_CONCURRENCY: a leak of this many slots stops every later call
CALL_SECONDS = 3.0  # each call's deadline: a leaked gate shows as an OutOfTimeError, not a hang

pytestmark = pytest.mark.timeout(60)


class Injected(RuntimeError):
    """Raised by a test hook inside botocore's handling of one attempt."""


@pytest.fixture
def proxy(aws: Any) -> Iterator[FaultProxy]:
    with FaultProxy(aws.endpoint_url, FaultPlan(rate=0.0)) as running:
        yield running


def settings_for(stack: SessionStack, **overrides: Any) -> Settings:
    return stack.settings(**{"max_concurrency": SLOTS, "botocore_max_attempts": 1, **overrides})


def describe(clients: ProxiedClients, stack: SessionStack, deadline: Deadline | None = None) -> dict[str, Any]:
    answer = call(
        clients.dynamodb.describe_table,
        "DescribeTable",
        deadline or Deadline.after(CALL_SECONDS),
        TableName=stack.table,
    )
    return dict(answer)


def failure(attempt: Callable[[], object]) -> BaseException:
    try:
        attempt()
    except Exception as exc:
        return exc
    raise AssertionError("the call did not fail")


def raising(*_: Any, **__: Any) -> None:
    raise Injected("injected by the test")


@pytest.mark.parametrize("kind", sorted(GARBLED))
def test_calls_still_run_after_more_garbled_502s_than_slots(stack: SessionStack, proxy: FaultProxy, kind: str) -> None:
    clients = ProxiedClients(settings_for(stack), proxy.url)
    proxy.plan.rates["dynamodb:DescribeTable"] = 1.0
    proxy.plan.kinds = (kind,)
    errors = [failure(lambda: describe(clients, stack)) for _ in range(SLOTS + 2)]

    proxy.plan.enabled = False
    answer = describe(clients, stack)

    assert answer["Table"]["TableName"] == stack.table
    assert all(type(error) is TransientError for error in errors), errors
    assert all("DescribeTable" in str(error) for error in errors)


@pytest.mark.parametrize("event", ["before-send", "before-parse", "response-received", "needs-retry"])
def test_calls_still_run_after_a_hook_raises_between_take_and_give_back(
    stack: SessionStack, proxy: FaultProxy, event: str
) -> None:
    clients = ProxiedClients(settings_for(stack), proxy.url)
    events = clients.dynamodb.meta.events
    # Registered after the pacer's hooks: before-send runs once the slot is taken; first among needs-retry's handlers
    # of this operation, so that it runs before the pacer's give-back.
    events.register_first(f"{event}.dynamodb.DescribeTable", raising, unique_id="test-raise")
    errors = [failure(lambda: describe(clients, stack)) for _ in range(SLOTS + 2)]

    events.unregister(f"{event}.dynamodb.DescribeTable", unique_id="test-raise")
    answer = describe(clients, stack)

    assert answer["Table"]["TableName"] == stack.table
    assert all(isinstance(error, TransientError) for error in errors), errors
    assert all("Injected: injected by the test" in str(error) for error in errors), errors


def test_without_a_deadline_a_wait_for_a_slot_ends_at_call_wait_seconds(stack: SessionStack, proxy: FaultProxy) -> None:
    clients = ProxiedClients(settings_for(stack, max_concurrency=1, call_wait_seconds=0.2), proxy.url)
    proxy.plan.latency["dynamodb:ListTables"] = 2.0  # the one slot is held this long by a listing
    dynamodb = clients.dynamodb  # made before the race (making a client holds a lock)

    with ThreadPoolExecutor(max_workers=1) as pool:
        holder = pool.submit(lambda: call(dynamodb.list_tables, "ListTables", None))
        waiter = failure(lambda: describe_when_busy(clients, stack))
        held = holder.result()

    assert "TableNames" in held  # the holder kept its slot and was answered
    assert isinstance(waiter, TransientError) and not isinstance(waiter, OutOfTimeError)
    assert "CALL_WAIT_SECONDS" in str(waiter)


def describe_when_busy(clients: ProxiedClients, stack: SessionStack) -> None:
    gate = clients.pacer.gate("dynamodb")
    while gate.in_flight < gate.limit:  # the holder's attempt has its slot once it is in flight
        time.sleep(0.01)
    describe(clients, stack, Deadline())


def test_a_quota_wait_bounds_the_wait_for_a_rates_turn_not_for_a_slot(stack: SessionStack, proxy: FaultProxy) -> None:
    # QUOTA_WAIT_SECONDS 0: no wait at all for a throttling service's turn. No service here throttles; the waiter only
    # waits for the one slot, which a listing holds: the deadline bounds that wait, and it is answered.
    settings = settings_for(stack, max_concurrency=1, quota_wait_seconds=0.0)
    clients = ProxiedClients(settings, proxy.url)
    proxy.plan.latency["dynamodb:ListTables"] = 1.0  # the one slot is held this long by a listing
    dynamodb = clients.dynamodb

    with ThreadPoolExecutor(max_workers=1) as pool:
        holder = pool.submit(lambda: call(dynamodb.list_tables, "ListTables", None))
        gate = clients.pacer.gate("dynamodb")
        while gate.in_flight < gate.limit:
            time.sleep(0.01)
        waited = describe(clients, stack, Deadline.after(30.0))
        held = holder.result()

    assert "TableNames" in held
    assert waited["Table"]["TableName"] == stack.table


def test_a_message_is_tagged_at_once_while_retiregrant_waits_for_its_own_quota(
    stack: SessionStack, proxy: FaultProxy
) -> None:
    # KMS counts RetireGrant against a quota of its own and GenerateMac against the cryptographic one: a backlog
    # message's tag must not wait for a turn at the rate that RetireGrant's throttling taught.
    settings = settings_for(stack, quota_wait_seconds=0.0)
    clients = ProxiedClients(settings, proxy.url)
    proxy.plan.quotas["kms:RetireGrant"] = 1.0
    retire = {"KeyId": stack.key_arn, "GrantId": "0" * 64}
    deferred = None
    for _ in range(200):  # until the pacer has learnt RetireGrant's rate and gives no turn at once
        try:
            with open_gate().sending(Deadline.after(CALL_SECONDS)):
                call(clients.kms.retire_grant, "RetireGrant", Deadline.after(CALL_SECONDS), **retire)
        except OutOfTimeError as exc:
            deferred = exc
            break
        except TransientError:
            continue  # throttled: still learning
    assert deferred is not None and "no turn" in str(deferred)

    tagged = seal('{"remaining": ["grant"]}', SimpleNamespace(settings=settings, clients=clients), Deadline.after(30.0))

    assert "integrity" in json.loads(tagged)


def test_a_request_that_waited_for_a_slot_while_the_rate_was_cut_takes_a_new_turn(
    stack: SessionStack, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its turn was given at the rate before the cut; sent when the slot frees, it would go on at the refused rate.
    clients = ProxiedClients(settings_for(stack, max_concurrency=1), proxy.url)
    proxy.plan.latency["dynamodb:ListTables"] = 1.0  # the one slot is held this long by a listing
    dynamodb = clients.dynamodb
    gate = clients.pacer.gate("dynamodb")
    reserved: list[float] = []
    reserve = gate.rate.reserve

    def recorded(latest: float) -> float | None:
        reserved.append(time.monotonic())
        return reserve(latest)

    monkeypatch.setattr(gate.rate, "reserve", recorded)
    with ThreadPoolExecutor(max_workers=2) as pool:
        holder = pool.submit(lambda: call(dynamodb.list_tables, "ListTables", None))
        while gate.in_flight < gate.limit:
            time.sleep(0.01)
        waiter = pool.submit(lambda: describe(clients, stack, Deadline.after(30.0)))
        while len(reserved) < 2:  # the waiter has its turn, and waits for the slot
            time.sleep(0.01)
        time.sleep(0.1)
        cut = time.monotonic()
        for throttled in [False] * 20 + [True] * 30:  # the service throttled others' requests meanwhile
            gate.rate.answered(cut, throttled=throttled)
        assert gate.rate.limit is not None
        waited = waiter.result()
        held = holder.result()

    assert "TableNames" in held and waited["Table"]["TableName"] == stack.table
    assert any(at > cut for at in reserved)  # a turn at the new rate, once it had the slot


def test_a_gate_starts_small_and_doubles_with_each_round_of_successes_until_trouble() -> None:
    gate = Lane(32, "kms")
    assert gate.limit == SLOW_START

    for expected in (8, 16, 32, 32):  # each round: as many successes as the limit
        for _ in range(gate.limit):
            taken = gate.acquire(0.0)
            assert taken is not None
            gate.release(taken, trouble=False, success=True)
        assert gate.limit == expected

    taken = gate.acquire(0.0)
    assert taken is not None
    gate.release(taken, trouble=True, success=False)  # a timeout: halved, and grown by one a round since
    assert gate.limit == 16
    for _ in range(16):
        taken = gate.acquire(0.0)
        assert taken is not None
        gate.release(taken, trouble=False, success=True)
    assert gate.limit == 17


def test_a_throttling_answer_ends_the_slow_start_without_lowering_the_limit(
    stack: SessionStack, proxy: FaultProxy
) -> None:
    # A quota's burst spent, its throttling answers come back first, each freeing its slot for another request into the
    # spent quota: doubling on would send MAX_CONCURRENCY of them before the rate is cut. One call admitted, one
    # answered "throttled", the quota lifted: the gate grows by one a round from there, not by one a success.
    clients = ProxiedClients(settings_for(stack, max_concurrency=32), proxy.url)
    gate = clients.pacer.gate("dynamodb")
    describe(clients, stack)
    proxy.plan.quotas["dynamodb:DescribeTable"] = 0.001  # a bucket that never holds a whole token: throttled
    assert isinstance(failure(lambda: describe(clients, stack)), TransientError)
    assert proxy.plan.over_quota["dynamodb:DescribeTable"] == 1
    proxy.plan.quotas.clear()

    for _ in range(SLOW_START):
        describe(clients, stack)

    assert gate.limit == SLOW_START + 1


def test_a_call_with_no_turn_in_call_wait_seconds_fails_once_that_wait_is_over_not_at_once(
    stack: SessionStack, proxy: FaultProxy
) -> None:
    # Failing at once, its caller's next call (the next record's) would find no turn either, and callers would spin.
    clients = ProxiedClients(settings_for(stack, call_wait_seconds=1.0), proxy.url)
    rate = clients.pacer.gate("dynamodb").rate
    assert rate.seed(0.0)  # at the floor: its first turn a turn's spacing away
    assert rate.reserve(time.monotonic() + 1.0) is None  # none within CALL_WAIT_SECONDS
    started = time.monotonic()

    refused = failure(lambda: call(clients.dynamodb.describe_table, "DescribeTable", None, TableName=stack.table))

    assert isinstance(refused, TransientError) and not isinstance(refused, OutOfTimeError)
    assert "no turn within CALL_WAIT_SECONDS" in str(refused)
    assert time.monotonic() - started >= 1.0
    assert not [sent for sent in proxy.plan.requests if sent.operation == "DescribeTable"]  # nothing was sent
