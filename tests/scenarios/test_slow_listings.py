"""A slow dependency slows the worker down instead of failing it: 40 sessions in a versioned bucket of 1,000 versions,
every ListObjectVersions 3 s slower, all clean on their first delivery with the default settings.

The slowness tested is the 3 s added to every listing (real S3 can take seconds, listing across many delete markers).
The bucket is kept small because moto walks every version of the bucket on each ListObjectVersions: at 5,000 versions
that walk cost 22 s of CPU in a 27 s delivery, which a machine running two suites at once stretched past the 120 s
timeout. At 1,000 versions the delivery takes about 12 s, 5 s of it CPU.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cleanup.runtime import Runtime
from cleanup.telemetry import Metrics, MetricsSink
from tests.proxy import FaultPlan, FaultProxy
from tests.scenarios.helpers import LambdaContext, ProxiedClients
from tests.stack import SessionStack
from worker import lambda_handler

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SESSIONS = 40
KEYS, VERSIONS = 5, 5  # 25 versions a session, 1,000 in the bucket
LISTING_LATENCY_SECONDS = 3.0


@pytest.fixture
def versioned(aws, request) -> SessionStack:
    return SessionStack.create(aws, request.node.name, versioned=True)


@pytest.fixture
def slow_listings(aws) -> Iterator[FaultProxy]:
    plan = FaultPlan(rate=0.0, latency={"s3:ListObjectVersions": LISTING_LATENCY_SECONDS})
    with FaultProxy(aws.endpoint_url, plan) as proxy:
        yield proxy


def test_a_batch_behind_slow_listings_is_clean_on_its_first_delivery(
    versioned: SessionStack, slow_listings: FaultProxy
) -> None:
    stack = versioned
    prefixes = [f"sessions/t1/s{n:02d}/" for n in range(SESSIONS)]
    stack.put_objects([f"{prefix}part-{k}" for prefix in prefixes for k in range(KEYS) for _ in range(VERSIONS)])
    for n, prefix in enumerate(prefixes):
        stack.put_item({"pk": f"session#s{n:02d}", "sk": "meta", "tenantId": "t1", "scratchPrefix": prefix})
    for n in range(SESSIONS):
        stack.delete(f"s{n:02d}")
    event = stack.lambda_event()
    settings = stack.settings(retry_max_wait_seconds=2.0)  # every other setting at its default
    runtime = Runtime(settings, ProxiedClients(settings, slow_listings.url), Metrics(settings, MetricsSink("off")))
    try:
        with lambda_handler.warm.use(runtime):
            answer = lambda_handler.handler(event, LambdaContext(120.0))  # the template's timeout
    finally:
        runtime.close()

    failed = {failure["itemIdentifier"] for failure in answer["batchItemFailures"]}
    clean = sum(1 for prefix in prefixes if stack.versions(prefix) == 0)
    print(f"\nsessions={SESSIONS} versions={SESSIONS * KEYS * VERSIONS} clean_on_first_delivery={clean}")
    assert failed == set()
    assert clean == SESSIONS
    assert stack.versions() == 0
