"""An invocation that spends its time waiting on a slow dependency still has the time to hand its records on: the
calls that defer them to the backlog (a tag, a send) start after the last try, before the invocation's end."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from cleanup.runtime import Runtime
from cleanup.telemetry import Metrics, MetricsSink
from tests.proxy import FaultPlan, FaultProxy
from tests.queues import on_queue
from tests.scenarios.helpers import LambdaContext, ProxiedClients, loaded_machine_margins
from tests.stack import SessionStack, client
from worker import lambda_handler

SESSIONS = 6


@pytest.fixture
def slow_grants(aws: Any) -> Iterator[FaultProxy]:
    """RetireGrant held past the invocation's end: its attempts run until the deadline cuts them."""
    with FaultProxy(aws.endpoint_url, FaultPlan(rate=0.0, latency={"kms:RetireGrant": 8.0})) as proxy:
        yield proxy


def test_records_waiting_on_a_slow_call_to_the_deadline_are_still_deferred_before_the_invocation_ends(
    stack: SessionStack, slow_grants: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    margin = loaded_machine_margins(monkeypatch)  # reporting six records may take seconds here
    items = [stack.put_session(f"q{n}") for n in range(SESSIONS)]
    for n in range(SESSIONS):
        stack.delete(f"q{n}")
    backlog = str(client("sqs").create_queue(QueueName=f"reporting-{stack.table}")["QueueUrl"])
    settings = stack.settings(backlog_queue_url=backlog, ws_callback_url=None)
    runtime = Runtime(settings, ProxiedClients(settings, slow_grants.url), Metrics(settings, MetricsSink("off")))
    context = LambdaContext(margin + 4.0)  # 4 s to work, shorter than a RetireGrant takes

    try:
        with lambda_handler.warm.use(runtime):
            answer = lambda_handler.handler(stack.lambda_event(), context)
    finally:
        runtime.close()

    assert context.get_remaining_time_in_millis() > 0, "answered after the invocation's end"
    assert answer == {"batchItemFailures": []}  # every record freed or handed on: none left to the stream
    waiting = [json.loads(body)["remaining"] for body in on_queue(backlog)]
    assert waiting == [["grant"]] * SESSIONS  # the rest was freed meanwhile
    assert all(stack.objects(item["scratchPrefix"]) == [] for item in items)
