"""The one rule, enforced where every freeing call leaves: a permit read after every wait, for every action kind.

Each test is one way the rule was broken while it was kept by each call site's manners: a permit asked before the
pacing wait, botocore sending a kind's call again on one permit, a read that did not fetch what only a kind holds, a
kind freeing with the reading it was launched with, a swallowed refusal counted as done, an item of a kind's own
taken for no session, a kind's exception failing the whole record, a made-up record freeing what binding should
protect; and the send-time check itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse

from cleanup.actions import loading
from cleanup.aws import coalesce, permits
from cleanup.aws.calls import call
from cleanup.core.guard import callback_endpoint
from cleanup.deadline import Deadline
from cleanup.queues.reporting import run_batch
from schemas.outcomes import ActionStatus, Outcome, Status
from schemas.records import read_lambda_event
from tests.action_rows import PartitionRows, Swallowing
from tests.action_tokens import Hanging, LateTokens, OwnClient, Raising, RuntimeClient, Tokens, token_key
from tests.faults import RawBody
from tests.stack import SessionStack
from tests.test_fence import garble
from worker.local.backend import create_registry_table, join_room

KINDS = (Tokens, LateTokens, Raising, Hanging, OwnClient, RuntimeClient, PartitionRows, Swallowing)


@pytest.fixture(autouse=True)
def kinds() -> Iterator[None]:
    for kind in KINDS:
        loading.register(kind)
    yield
    for kind in KINDS:
        loading.unregister(kind.name)
    check = permits.default_check()
    if check is not None:  # what these kinds declared is no later test's
        check.declared.clear()


def removed(stack: SessionStack, runtime: Any, deadline: Deadline | None = None) -> list[Outcome]:
    return [
        o for o in run_batch(read_lambda_event(stack.lambda_event()), runtime, deadline) if o.event_name == "REMOVE"
    ]


def statuses(outcome: Outcome) -> dict[str, ActionStatus]:
    return {action.action: action.status for action in outcome.actions}


def with_token(stack: SessionStack, sid: str, **session: Any) -> dict[str, Any]:
    """A session whose item names a token (``tokenId``) besides what ``put_session`` gives it, and the token's item."""
    token = f"tok-{sid}"
    stack.ddb.put_item(TableName=stack.table, Item={**token_key(token), "owner": {"S": sid}})
    return stack.put_session(sid, extra={"tokenId": token}, **session)


def token_exists(stack: SessionStack, sid: str) -> bool:
    return "Item" in stack.ddb.get_item(TableName=stack.table, Key=token_key(f"tok-{sid}"), ConsistentRead=True)


# 1. The permit is asked after the pacing wait, not before it.
@pytest.mark.parametrize("kind", ["grant", "connection"])
def test_a_freeing_call_that_waited_for_its_turn_reads_the_live_item_after_the_wait(
    stack: SessionStack, kind: str
) -> None:
    sessions = []
    for n in range(4):
        item = stack.put_session(
            f"q{n}", objects=0, grant=kind == "grant", connection_id=f"conn-q{n}" if kind == "connection" else None
        )
        item.pop("scratchPrefix")  # nothing else to free: the first read is this kind's own permit
        stack.put_item(item)
        sessions.append(item)
    for n in range(4):
        stack.delete(f"q{n}")
    runtime = stack.runtime(ws_callback_url=stack.aws.endpoint_url)
    service, operation = ("kms", "RetireGrant") if kind == "grant" else ("apigatewaymanagementapi", "DeleteConnection")
    runtime.clients.pacer.seed({service: 2.0})  # a learnt quota: turns half a second apart
    freeing = (
        runtime.clients.kms
        if kind == "grant"
        else runtime.clients.management(callback_endpoint(None, runtime.settings), None)
    )
    back_at: list[float] = []

    def back_at_the_first_read(**_: Any) -> None:  # every session re-created as the first read is answered
        if not back_at:
            for item in sessions:
                stack.put_item(item)
            back_at.append(time.monotonic())

    sent: list[float] = []

    def leaving(event_name: str, **_: Any) -> None:  # the last hook before the request leaves
        if event_name.endswith(f".{operation}"):
            sent.append(time.monotonic())

    runtime.clients.dynamodb.meta.events.register("after-call.dynamodb.BatchGetItem", back_at_the_first_read)
    freeing.meta.events.register_last("before-send", leaving)

    outcomes = removed(stack, runtime)

    bound = runtime.settings.fence_read_max_age_seconds
    assert back_at and sent
    assert [round(at - back_at[0], 2) for at in sent if at - back_at[0] > bound] == []  # none on a read from before
    kept = [outcome for outcome in outcomes if statuses(outcome).get(kind) is ActionStatus.KEPT]
    assert len(kept) == len(outcomes) - len(sent) >= 1
    if kind == "grant":
        assert len({item["grantId"] for item in sessions} & stack.grant_ids()) == 4 - len(sent)


# 2. botocore does not send a kind's own freeing call again on one permit.
def test_a_kinds_declared_freeing_call_is_never_sent_again_by_botocore_on_one_permit(
    stack: SessionStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACTIONS", "tokens")
    old = with_token(stack, "b1")
    stack.delete("b1")
    runtime = stack.runtime()  # botocore's standard retries on: three attempts
    sent: list[int] = []

    def throttled_while_the_user_is_back(request: Any, event_name: str, **_: Any) -> AWSResponse | None:
        if not event_name.endswith(".DeleteItem"):
            return None
        sent.append(1)
        if len(sent) > 1:
            return None
        stack.put_item(old)
        headers = {"x-amzn-ErrorType": "ThrottlingException", "Content-Type": "application/x-amz-json-1.0"}
        body = b'{"__type": "com.amazonaws.dynamodb.v20120810#ThrottlingException", "message": "slow down"}'
        return AWSResponse(request.url, 400, headers, RawBody(body))

    runtime.clients.dynamodb.meta.events.register_last("before-send", throttled_while_the_user_is_back)

    [outcome] = removed(stack, runtime)

    assert sent == [1]  # tried again only after a fresh read, which found the session back
    assert token_exists(stack, "b1")
    assert outcome.status is Status.FAILED and not outcome.permanent


# 3. The fence reads what only a kind holds.
def test_the_fence_reads_an_attribute_only_a_kind_holds_and_keeps_its_resource(
    stack: SessionStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACTIONS", "connection,grant,scratch,tokens")
    old = with_token(stack, "a1")
    stack.delete("a1")
    back = {**old, "grantId": "another-grant", "scratchPrefix": "sessions/t1/a1/v2/"}
    stack.put_item({key: value for key, value in back.items() if key != "connectionId"})  # back, same token only

    [outcome] = removed(stack, stack.runtime())

    assert statuses(outcome)["tokens"] is ActionStatus.KEPT
    assert token_exists(stack, "a1")


# 4. A kind freed beside another on one read reads again when that read is no longer fresh.
def test_a_kind_launched_on_one_read_reads_again_when_its_call_comes_later(
    stack: SessionStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACTIONS", "connection,late-tokens")
    LateTokens.back.clear()
    old = with_token(stack, "l1", connection_id="conn-l1", objects=0, grant=False)
    stack.delete("l1")
    runtime = stack.runtime(ws_callback_url=stack.aws.endpoint_url)
    management = runtime.clients.management(callback_endpoint(None, runtime.settings), None)

    def back_once_the_socket_is_closed(**_: Any) -> None:
        stack.put_item({key: value for key, value in old.items() if key != "connectionId"})
        LateTokens.back.set()

    management.meta.events.register(
        "after-call.apigatewaymanagementapi.DeleteConnection", back_once_the_socket_is_closed
    )

    [outcome] = removed(stack, runtime)

    assert statuses(outcome) == {"connection": ActionStatus.DONE, "late-tokens": ActionStatus.KEPT}
    assert token_exists(stack, "l1")


# 5. A kind that swallows a refusal is not reported done.
def test_a_kind_that_swallows_a_failed_read_is_reported_failed_not_done(
    stack: SessionStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACTIONS", "scratch,swallowing")
    monkeypatch.setenv("ROWS_SORT_PREFIX", "draft#")
    stack.put_session("w1")
    stack.put_item({"pk": "session#w1", "sk": "draft#1", "note": "x"})
    stack.delete("w1")
    runtime = stack.runtime(botocore_max_attempts=1, retry_max_wait_seconds=0.01)
    garble(runtime, "{}")  # every read of the live item answers a body that says nothing

    [outcome] = removed(stack, runtime)

    assert outcome.status is Status.FAILED and not outcome.permanent
    assert statuses(outcome)["swallowing"] is ActionStatus.FAILED
    found = stack.ddb.get_item(TableName=stack.table, Key={"pk": {"S": "session#w1"}, "sk": {"S": "draft#1"}})
    assert "Item" in found


# 6. An item holding only a kind's own attribute is a session.
def test_a_deployment_of_one_kind_cleans_items_that_hold_only_its_attribute(
    stack: SessionStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACTIONS", "tokens")
    stack.ddb.put_item(TableName=stack.table, Item={**token_key("tok-o1"), "owner": {"S": "o1"}})
    stack.put_item({"pk": "session#o1", "sk": "meta", "tokenId": "tok-o1"})
    stack.delete("o1")

    [outcome] = removed(stack, stack.runtime())

    assert outcome.status is Status.CLEANED and statuses(outcome) == {"tokens": ActionStatus.DONE}
    assert not token_exists(stack, "o1")


# 7. An exception of a kind's own is that kind's failure; the others still run and are reported.
def test_a_kinds_own_exception_fails_that_kind_alone_and_the_others_are_freed_and_reported(
    stack: SessionStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACTIONS", "raising,grant,scratch")
    old = stack.put_session("r1", objects=3)
    stack.delete("r1")

    [outcome] = removed(stack, stack.runtime(retry_max_wait_seconds=0.01))

    assert statuses(outcome) == {
        "raising": ActionStatus.FAILED,
        "grant": ActionStatus.DONE,
        "scratch": ActionStatus.DONE,
    }
    assert outcome.status is Status.FAILED and not outcome.permanent
    assert "ConnectionError" in (outcome.error or "")
    assert stack.objects(old["scratchPrefix"]) == [] and old["grantId"] not in stack.grant_ids()


# 8. A made-up record frees nothing binding protects.
def test_a_made_up_record_naming_a_live_connection_leaves_its_memberships(stack: SessionStack) -> None:
    registry = f"registry-{stack.table}"
    create_registry_table(stack.ddb, registry)
    stack.put_session("victim", connection_id="conn-victim")
    for room in ("r1", "r2", "r3"):
        join_room(stack.ddb, registry, room, "conn-victim", user_id="u-v", shard=0, session_id="victim")
    stack.put_item({"pk": "session#forged", "sk": "meta", "tenantId": "t1", "connectionId": "conn-victim"})
    stack.delete("forged")

    [outcome] = removed(stack, stack.runtime(registry_table=registry, ws_callback_url=stack.aws.endpoint_url))

    assert stack.ddb.scan(TableName=registry, ConsistentRead=True)["Count"] == 3
    assert outcome.status is Status.CLEANED  # nothing of the forged session's own was left: kept is not failed
    assert next(a for a in outcome.actions if a.action == "registry").detail["kept"] == 3


def test_a_prefix_nested_in_another_sessions_folder_is_not_bound(stack: SessionStack) -> None:
    stack.put_objects(["sessions/t1/victim/forged/notes", "sessions/t1/victim/forged/draft"])
    stack.put_item(
        {"pk": "session#forged", "sk": "meta", "tenantId": "t1", "scratchPrefix": "sessions/t1/victim/forged/"}
    )
    stack.delete("forged")

    [outcome] = removed(stack, stack.runtime())

    assert len(stack.objects("sessions/t1/victim/forged/")) == 2
    assert outcome.status is Status.FAILED and outcome.permanent
    assert "not bound" in (outcome.error or "")


# The send-time check itself.
@pytest.mark.freeing_refused
def test_a_freeing_call_made_outside_a_gate_is_refused_at_the_send(stack: SessionStack) -> None:
    item = stack.put_session("x1", objects=0)
    runtime = stack.runtime()
    seen: list[permits.Violation] = []

    with permits.observed(seen.append), pytest.raises(permits.RefusedSendError, match="no permit"):
        call(runtime.clients.kms.retire_grant, "RetireGrant", None, KeyId=stack.key_arn, GrantId=item["grantId"])

    assert item["grantId"] in stack.grant_ids()  # nothing was sent
    assert [(v.what, v.targets, v.bug) for v in seen] == [("RetireGrant", (f"grant:{item['grantId']}",), True)]


@pytest.mark.freeing_refused
def test_a_permit_that_does_not_cover_the_request_or_is_stale_is_refused() -> None:
    check = permits.SendCheck(0.25)

    class Old:
        def authorize(self, deadline: Any) -> permits.Permit:
            return permits.Permit("grant", frozenset({"grant:g1"}), read_at=time.monotonic() - 1.0)

    class Other:
        def authorize(self, deadline: Any) -> permits.Permit:
            return permits.Permit("grant", frozenset({"grant:g2"}), read_at=time.monotonic())

    with permits.authorized(Old()), pytest.raises(permits.StalePermitError, match=r"[0-9]+ ms old"):
        check.check("RetireGrant", ("grant:g1",), None)
    with permits.authorized(Other()), pytest.raises(permits.RefusedSendError, match="does not cover grant:g1"):
        check.check("RetireGrant", ("grant:g1",), None)


@pytest.mark.freeing_refused
@pytest.mark.parametrize("kind", ["own-client", "runtime-client"])
def test_a_kind_freeing_with_a_client_of_its_own_frees_nothing(
    stack: SessionStack, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    monkeypatch.setenv("ACTIONS", kind)
    with_token(stack, "c1")
    stack.delete("c1")

    [outcome] = removed(stack, stack.runtime(retry_max_wait_seconds=0.01))

    assert statuses(outcome)[kind] is ActionStatus.FAILED and outcome.permanent
    assert token_exists(stack, "c1")


def test_a_kind_still_running_at_the_records_deadline_is_reported_and_frees_nothing_after(
    stack: SessionStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACTIONS", "grant,hanging")
    Hanging.release.clear()
    Hanging.finished.clear()
    Hanging.tried.clear()
    old = with_token(stack, "h1", objects=0)
    stack.delete("h1")

    [outcome] = removed(stack, stack.runtime(), Deadline.after(3.0))
    Hanging.release.set()  # it goes on, and tries its call: its gate is closed
    assert Hanging.finished.wait(timeout=60)

    assert statuses(outcome) == {"grant": ActionStatus.DONE, "hanging": ActionStatus.FAILED}
    assert outcome.status is Status.FAILED and not outcome.permanent and "still running" in (outcome.error or "")
    assert old["grantId"] not in stack.grant_ids()
    assert token_exists(stack, "h1") and isinstance(Hanging.tried[0], Exception)


@pytest.mark.freeing_refused
def test_boto3s_default_session_is_held_to_the_check_in_the_suite(stack: SessionStack) -> None:
    item = stack.put_session("d1", objects=0)
    with permits.authorized(_Nothing()), pytest.raises(permits.RefusedSendError, match="does not cover"):
        boto3.client("kms").retire_grant(KeyId=stack.key_arn, GrantId=item["grantId"])
    assert item["grantId"] in stack.grant_ids()


class _Nothing:
    """An authority whose permit covers nothing."""

    def authorize(self, deadline: Any) -> permits.Permit:
        return permits.Permit("nothing", read_at=time.monotonic())


def test_a_page_that_waited_in_the_coalescer_is_read_again_when_the_shared_call_leaves(
    stack: SessionStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two records' pages go in one DeleteObjects: a's waits for b's, whose listing is slow (the batch's requests wait
    # up to 2 s for a batchmate here). a's session is back while it waits; the shared call's permit, asked where it
    # leaves, reads both items then.
    monkeypatch.setattr(coalesce.Batchmates.__init__, "__defaults__", (0, 2.0, 2.0))
    a = stack.put_session("a", objects=2, grant=False)
    stack.put_session("b", objects=2, grant=False)
    stack.delete("a")
    stack.delete("b")
    runtime = stack.runtime()
    deletes: list[list[str]] = []

    def slow_listing_of_b(params: dict[str, Any], **_: Any) -> None:
        if params.get("Prefix") == "sessions/t1/b/" and not deletes:
            time.sleep(0.3)  # a's page is listed and waits in the coalescer for b's

    def a_back_as_b_is_listed(parsed: dict[str, Any], **_: Any) -> None:
        if parsed.get("Prefix") == "sessions/t1/b/" and not deletes:
            stack.put_item(a)

    def shared(params: dict[str, Any], **_: Any) -> None:
        deletes.append(sorted(entry["Key"] for entry in params["Delete"]["Objects"]))

    runtime.clients.s3.meta.events.register("before-parameter-build.s3.ListObjectsV2", slow_listing_of_b)
    runtime.clients.s3.meta.events.register("after-call.s3.ListObjectsV2", a_back_as_b_is_listed)
    runtime.clients.s3.meta.events.register("before-parameter-build.s3.DeleteObjects", shared)

    outcomes = {o.key.split("#")[-1].split(",")[0]: o for o in removed(stack, runtime)}

    assert len(stack.objects("sessions/t1/a/")) == 2  # kept: its session is back
    assert stack.objects("sessions/t1/b/") == []
    assert all(not key.startswith("sessions/t1/a/") for sent in deletes[-1:] for key in sent)
    assert statuses(outcomes["a"])["scratch"] is ActionStatus.KEPT
