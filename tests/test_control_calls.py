"""Control calls are not starved by data calls: with the session table throttling every BatchGetItem, and workers
hammering it from the same process, the stream lease is still renewed in time, term after term, and a standby never
takes it over."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from cleanup.aws.calls import call
from cleanup.exceptions import CleanupError
from cleanup.streams.checkpoints import ensure_table
from cleanup.streams.lease import Heartbeat, Lease
from tests.proxy import FaultPlan, FaultProxy
from tests.scenarios.helpers import ProxiedClients
from tests.stack import SessionStack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

LEASE_SECONDS = 1.5
TERMS = 4
DATA_THREADS = 8
CALL_WAIT_SECONDS = 2.0
STREAM = "arn:aws:dynamodb:us-east-1:123456789012:table/sessions/stream/2024-01-01T00:00:00.000"


@pytest.fixture
def throttled_sessions(aws: Any) -> Iterator[FaultProxy]:
    plan = FaultPlan(rate=0.0, rates={"dynamodb:BatchGetItem": 1.0}, kinds=("throttle",))
    with FaultProxy(aws.endpoint_url, plan) as proxy:
        yield proxy


def hammer(clients: ProxiedClients, stack: SessionStack, stop: threading.Event) -> None:
    """Race reads of the session table, as the poller's workers make them (no deadline), until ``stop``."""
    keys = [{"pk": {"S": f"session#s{n}"}, "sk": {"S": "meta"}} for n in range(10)]
    while not stop.is_set():
        with contextlib.suppress(CleanupError):  # throttled: the next read goes on, as the next record's would
            call(clients.dynamodb.batch_get_item, "BatchGetItem", None, RequestItems={stack.table: {"Keys": keys}})


def longest_silence(stack: SessionStack, table: str, stop: threading.Event) -> float:
    """The longest time the lease's version stayed unchanged, as a standby polling it would see."""
    key = {"stream": {"S": STREAM}, "shard": {"S": "#lease"}}
    seen, since, longest = None, time.monotonic(), 0.0
    while not stop.wait(0.05):
        item = stack.ddb.get_item(TableName=table, Key=key, ConsistentRead=True).get("Item", {})
        version, now = item.get("version", {}).get("N"), time.monotonic()
        if version != seen:
            seen, since = version, now
        longest = max(longest, now - since)
    return longest


def test_lease_renewals_keep_their_term_while_the_session_table_throttles_every_read(
    stack: SessionStack, throttled_sessions: FaultProxy
) -> None:
    table = f"ckpt-{stack.table}"
    ensure_table(stack.ddb, table)
    # A data call waits CALL_WAIT_SECONDS for a turn at most (the session table's rate falls to its floor), and then
    # fails: the hammering threads end within a few seconds of the test (at the default, a minute a call).
    settings = stack.settings(
        checkpoint_table=table, max_concurrency=4, lease_seconds=LEASE_SECONDS, call_wait_seconds=CALL_WAIT_SECONDS
    )
    clients = ProxiedClients(settings, throttled_sessions.url)
    holder = Lease(clients.dynamodb, table, STREAM, "holder", LEASE_SECONDS)
    standby = Lease(stack.ddb, table, STREAM, "standby", LEASE_SECONDS)
    assert holder.try_acquire()
    stop, taken_over = threading.Event(), []

    with Heartbeat(holder), ThreadPoolExecutor(max_workers=DATA_THREADS + 1) as pool:
        for _ in range(DATA_THREADS):
            pool.submit(hammer, clients, stack, stop)
        silence = pool.submit(longest_silence, stack, table, stop)
        deadline = time.monotonic() + TERMS * LEASE_SECONDS
        while time.monotonic() < deadline:
            taken_over.append(standby.try_acquire())
            time.sleep(LEASE_SECONDS / 6)
        stop.set()
        longest = silence.result()
    print(f"longest silence of the lease: {longest:.2f} s (term {LEASE_SECONDS} s)")

    assert throttled_sessions.plan.by_call[("dynamodb", "BatchGetItem", "throttle")] > 0
    assert not any(taken_over), f"a standby took the lease over (longest silence {longest:.2f} s)"
    assert holder.held
