"""The Lambda deadline: a big prefix behind slow listings stops between pages, keeps its progress, and the handler
answers before the invocation's end; the next delivery finishes the job."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cleanup.runtime import Runtime
from cleanup.telemetry import Metrics, MetricsSink
from tests.proxy import FaultPlan, FaultProxy
from tests.scenarios.helpers import LambdaContext, ProxiedClients, loaded_machine_margins
from tests.stack import SessionStack
from worker import lambda_handler

pytestmark = pytest.mark.slow

OBJECTS = 8_000
SLOW_LISTING_SECONDS = 1.0  # 8 pages: longer than the first invocation's time to work, however fast the machine


@pytest.fixture
def slow_listings(aws) -> Iterator[FaultProxy]:
    plan = FaultPlan(rate=0.0, latency={"s3:ListObjectsV2": SLOW_LISTING_SECONDS})
    with FaultProxy(aws.endpoint_url, plan) as proxy:
        yield proxy


def invoke(stack: SessionStack, proxy: FaultProxy, event: dict, seconds: float) -> tuple[dict, LambdaContext]:
    settings = stack.settings()
    runtime = Runtime(settings, ProxiedClients(settings, proxy.url), Metrics(settings, MetricsSink("off")))
    context = LambdaContext(seconds)
    try:
        with lambda_handler.warm.use(runtime):
            return lambda_handler.handler(event, context), context
    finally:
        runtime.close()


def test_a_big_prefix_behind_slow_pages_answers_before_the_deadline_and_keeps_its_progress(
    stack: SessionStack, slow_listings: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    margin = loaded_machine_margins(monkeypatch)  # kept to report and answer, however loaded the machine
    prefix = "sessions/t1/big/"
    stack.put_objects([f"{prefix}part-{n:05d}" for n in range(OBJECTS)])
    neighbour = stack.put_session("big-neighbour", objects=2, grant=False)
    stack.put_item({"pk": "session#big", "sk": "meta", "tenantId": "t1", "scratchPrefix": prefix})
    stack.delete("big")
    event = stack.lambda_event()
    remove = event["Records"][-1]["dynamodb"]["SequenceNumber"]

    answer, context = invoke(stack, slow_listings, event, seconds=margin + 6.0)  # 6 s to work: a page or more

    assert context.get_remaining_time_in_millis() > 0, "answered after the invocation's end"
    assert answer == {"batchItemFailures": [{"itemIdentifier": remove}]}  # transient: reported, not dead-lettered
    left = len(stack.objects(prefix))
    assert 0 < left < OBJECTS, f"{left} left"  # stopped between pages, what it deleted stays deleted

    again, _ = invoke(stack, slow_listings, event, seconds=margin + 120.0)

    assert again == {"batchItemFailures": []}
    assert stack.objects(prefix) == []
    assert len(stack.objects(neighbour["scratchPrefix"])) == 2
