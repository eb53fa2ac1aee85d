"""Scenario 5: a mass expiry meets a KMS request quota (5 RetireGrant a second, throttled beyond, as the fault proxy
enforces it). The worker learns the rate KMS allows and keeps to it: 100 sessions clean in one Lambda delivery, at
close to the quota, with few requests throttled rather than most of them retried.

The quota is well under the worker's own pace against moto even on a loaded machine (11.6 RetireGrant a second was
seen while other tests ran beside it; at a quota of 10 a second, a run on a machine running two suites at once met
it at 105% with 108 of 258 requests throttled), so that what the test measures is the pacing, not the machine."""

from __future__ import annotations

import pytest

from tests.proxy import Call
from tests.scenarios.helpers import LambdaContext, World, assert_final_state, new_ids
from worker import lambda_handler

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SESSIONS = 100
QUOTA = 5.0  # RetireGrant requests a second
INVOCATION_SECONDS = 120.0  # time enough: 100 grants at 5 a second take 20 s


def test_a_mass_expiry_under_a_kms_quota_is_clean_in_one_delivery_near_the_quota(world: World) -> None:
    ended = world.make_sessions(new_ids(SESSIONS, "quota"), sockets=10, objects=1)
    world.end(ended)
    event = {"Records": world.records()}
    world.plan.quotas = {"kms:RetireGrant": QUOTA}
    # The deployed defaults, but for the endpoints: retries and timeouts as in Lambda.
    runtime = world.runtime(
        botocore_max_attempts=3, http_timeout_seconds=5.0, bulk_timeout_seconds=30.0, retry_max_wait_seconds=2.0
    )
    with lambda_handler.warm.use(runtime):
        answer = lambda_handler.handler(event, LambdaContext(INVOCATION_SECONDS))

    achieved = world.plan.achieved_rate("kms:RetireGrant")
    throttled = world.plan.over_quota["kms:RetireGrant"]
    sent = world.plan.requests[Call("kms", "RetireGrant")]
    learnt = runtime.clients.pacer.gate("kms").rate.limit
    print(
        f"\nsessions={SESSIONS} quota={QUOTA:.0f}/s achieved={achieved:.1f}/s ({achieved / QUOTA:.0%}) "
        f"RetireGrant requests={sent} throttled={throttled} rate learnt={learnt or 0:.1f}/s"
    )
    world.plan.enabled = False
    assert answer == {"batchItemFailures": []}
    assert_final_state(world, deleted=ended, live=[])
    assert achieved >= 0.8 * QUOTA
    assert throttled <= 0.3 * sent  # settled near the quota, not sending on into it
