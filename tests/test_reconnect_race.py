"""The reconnect race: a live session recreated under the deleted one's key keeps every byte it may still use."""

from __future__ import annotations

import pytest

from cleanup.core.guard import ScratchLocation
from cleanup.core.holding import Holding, scratch_holding
from cleanup.queues.reporting import run_batch
from schemas.outcomes import ActionStatus, Status
from schemas.records import read_lambda_event
from tests.stack import SessionStack

OLD = ScratchLocation("scratch", "sessions/t1/s1/")


def reconnect(stack: SessionStack, live_prefix: str, *, tenant: str | None = "t1", **settings: object):
    """Delete session s1, recreate its key with ``live_prefix``, and clean the REMOVE; returns its outcome."""
    old = stack.put_session("s1", objects=2)
    stack.delete("s1")
    stack.s3.put_object(Bucket=stack.bucket, Key="sessions/t1/s1/v2/live-object", Body=b"live")
    live = {**old, "grantId": "another-grant", "scratchPrefix": live_prefix.format(bucket=stack.bucket)}
    if tenant is None:
        del live["tenantId"]
    stack.put_item(live)
    outcomes = run_batch(read_lambda_event(stack.lambda_event()), stack.runtime(**settings))
    return old, next(o for o in outcomes if o.event_name == "REMOVE")


@pytest.mark.parametrize(
    ("live_prefix", "tenant", "settings"),
    [
        ("sessions/t1/s1", "t1", {}),  # no trailing slash: the guard would refuse it, it still points there
        ("sessions/t1/s1/v2", "t1", {}),  # inside the old prefix, no trailing slash
        ("sessions/t1/s1/v2/", "t1", {}),
        ("s3://{bucket}/sessions/t1/s1/", None, {"scratch_tenant_scoped": True}),  # unscoped live item, URI form
        ("s3://{bucket}/sessions/t1/", None, {"scratch_tenant_scoped": True}),  # around the old prefix
        ("sessions/t1/./s1/", "t1", {}),
        ("sessions/t2/../t1/s1/", "t1", {}),
        ("sessions%2Ft1%2Fs1/", "t1", {}),
        ("/sessions/t1/s1/", "t1", {}),
        ("sessions\\t1\\s1\\", "t1", {}),
    ],
)
def test_a_live_prefix_that_overlaps_however_spelled_keeps_the_old_one(
    stack: SessionStack, live_prefix: str, tenant: str | None, settings: dict[str, object]
) -> None:
    old, outcome = reconnect(stack, live_prefix, tenant=tenant, **settings)

    assert {a.action: a.status for a in outcome.actions}["scratch"] is ActionStatus.KEPT
    assert len(stack.objects("sessions/t1/s1/")) == 3  # the old objects and the live one
    assert old["grantId"] not in stack.grant_ids()  # the grant the live item does not hold is retired


@pytest.mark.parametrize(
    "live_prefix",
    ["https://{bucket}.s3.amazonaws.com/sessions/t1/s1/", "s3:///sessions/t1/s1/", "arn:aws:s3:::{bucket}/sessions/"],
)
def test_a_live_prefix_that_names_no_s3_location_keeps_the_old_one_and_fails_permanently(
    stack: SessionStack, live_prefix: str
) -> None:
    old, outcome = reconnect(stack, live_prefix)

    scratch = {a.action: a for a in outcome.actions}["scratch"]
    assert outcome.status is Status.FAILED and outcome.permanent
    assert scratch.status is ActionStatus.FAILED and scratch.permanent
    assert live_prefix.format(bucket=stack.bucket) in (scratch.error or "")
    assert "sessions/t1/s1/" in (scratch.error or "")
    assert len(stack.objects("sessions/t1/s1/")) == 3
    assert old["grantId"] not in stack.grant_ids()


def test_a_live_prefix_elsewhere_lets_the_old_one_go(stack: SessionStack) -> None:
    old, outcome = reconnect(stack, "sessions/t1/s1-next/")

    assert {a.action: a.status for a in outcome.actions}["scratch"] is ActionStatus.DONE
    assert stack.objects("sessions/t1/s1/") == []
    del old


@pytest.mark.parametrize(
    ("live_prefix", "expected"),
    [
        ("sessions/t1/s1x/", Holding.FREE),  # shares characters, not keys
        ("sessions/t1/s", Holding.HELD),  # a bare prefix of characters covers sessions/t1/s1/...
        ("s3://other-bucket/sessions/t1/s1/", Holding.FREE),
        ("s3://SCRATCH/sessions/t1/s1/", Holding.HELD),
        ("", Holding.HELD),  # the whole bucket
        ("ftp://scratch/sessions/t1/s1/", Holding.UNKNOWN),
    ],
)
def test_scratch_holding_compares_locations(live_prefix: str, expected: Holding) -> None:
    assert scratch_holding(OLD, live_prefix, "scratch") is expected


def reconnect_during(stack: SessionStack, operation: str, objects: int, **settings: object):
    """Session s1 is deleted; the worker cleans it, and as soon as the first ``operation`` is answered the user
    reconnects: s1 is created again under the same key and prefix, with a new object (a user back before a freeing
    call leaves is seen by its permit's read, asked where it leaves). Returns the old item and the REMOVE's
    outcome."""
    old = stack.put_session("s1", objects=objects)
    stack.delete("s1")
    event = stack.lambda_event()
    runtime = stack.runtime(**settings)
    service, name = operation.split(".")
    client = runtime.clients.kms if service == "kms" else runtime.clients.s3
    reconnected: list[bool] = []

    def reconnect_now(**_: object) -> None:
        if not reconnected:
            reconnected.append(True)
            stack.put_item({**old, "grantId": "new-grant"})
            stack.s3.put_object(Bucket=stack.bucket, Key=f"{old['scratchPrefix']}new-session-data", Body=b"live")

    client.meta.events.register(f"after-call.{service}.{name}", reconnect_now)
    outcomes = run_batch(read_lambda_event(event), runtime)
    return old, next(o for o in outcomes if o.event_name == "REMOVE")


def test_a_session_recreated_while_its_grant_is_retired_keeps_its_new_data(stack: SessionStack) -> None:
    # Retiring a grant can take seconds under a KMS quota: the scratch data is freed before it, while the race check
    # read is fresh, so a user back by then finds their new data whole.
    old, outcome = reconnect_during(stack, "kms.RetireGrant", objects=3)

    assert outcome.status is Status.CLEANED
    assert stack.objects(old["scratchPrefix"]) == [f"{old['scratchPrefix']}new-session-data"]
    assert old["grantId"] not in stack.grant_ids()
    assert [a.action for a in outcome.actions] == ["grant", "scratch"]  # reported in plan order


def test_a_session_recreated_between_two_pages_keeps_the_rest_of_the_prefix(
    stack: SessionStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("cleanup.actions.scratch.PAGE", 2)  # five objects: three pages
    old, outcome = reconnect_during(stack, "s3.DeleteObjects", objects=5)

    scratch_result = next(a for a in outcome.actions if a.action == "scratch")
    left = stack.objects(old["scratchPrefix"])
    assert scratch_result.status is ActionStatus.KEPT and scratch_result.detail["objects"] == 2  # the first page
    assert f"{old['scratchPrefix']}new-session-data" in left and len(left) == 4
