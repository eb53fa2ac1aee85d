"""The one rule before every destructive call: a fresh read of the live item, positively understood, or keep.

The first tests are holes the rule once had, one each; the last is the rule itself, checked over scripts in which the
session comes back between any two AWS calls, any call may fail or be answered with garbage, the freeing calls may
wait for their turns at a learnt rate, botocore may retry, and a kind that is not built in frees beside the
built-ins: every destructive attempt must follow a clean read that did not hold what it frees, taken after the
previous destructive attempt and at most ``schedule.WAITED_AT_MOST`` before it (after any wait).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cleanup.actions import loading
from cleanup.queues.reporting import run_batch
from cleanup.runtime import Runtime
from cleanup.telemetry import LOGGER_NAME, Metrics, MetricsSink
from schemas.outcomes import ActionStatus, Outcome, Status
from schemas.records import read_lambda_event
from tests.action_tokens import Tokens, token_key
from tests.faults import RawBody
from tests.schedule import FAULTS, FenceLog, Script, ScriptedClients, violations
from tests.stack import SessionStack
from worker.local.gateway import LocalGateway


def scripted_runtime(stack: SessionStack, script: Script, live: dict[str, Any] | None, **overrides: Any) -> Runtime:
    """A runtime whose clients play ``script``; the fence's DEBUG lines go to the same log (``FenceLog``)."""
    values = {
        "botocore_max_attempts": 1,
        "retry_max_wait_seconds": 0.01,
        "ws_callback_url": stack.aws.endpoint_url,  # moto's management API: any connection "exists"
        **overrides,
    }
    settings = stack.settings(**values)
    clients = ScriptedClients(settings, script, live, stack.put_item)
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(logging.DEBUG)  # restored after the test (conftest's worker_logger)
    for handler in [h for h in logger.handlers if isinstance(h, FenceLog)]:
        logger.removeHandler(handler)
    logger.addHandler(FenceLog(clients))
    return Runtime(settings, clients, Metrics(settings, MetricsSink("off")))


def clean(stack: SessionStack, runtime: Runtime) -> Outcome:
    outcomes = run_batch(read_lambda_event(stack.lambda_event()), runtime)
    return next(o for o in outcomes if o.event_name == "REMOVE")


def statuses(outcome: Outcome) -> dict[str, ActionStatus]:
    return {a.action: a.status for a in outcome.actions}


def test_a_retried_step_reads_the_live_item_again(stack: SessionStack, gateway: LocalGateway) -> None:
    # The user is back while the first listing of the old prefix fails with a 500: the step is tried again, and by
    # then the prefix, the grant and the socket are the live session's again.
    socket = gateway.connect()
    old = stack.put_session("s1", objects=5, connection_id=socket.connection_id)
    stack.delete("s1")
    runtime = stack.runtime(ws_callback_url=gateway.callback_url, botocore_max_attempts=1)
    failed: list[bool] = []

    def back_while_failing(request: Any, **_: Any) -> AWSResponse | None:
        if failed:
            return None
        failed.append(True)
        stack.put_item(old)
        return AWSResponse(request.url, 500, {}, RawBody(b"<Error><Code>InternalError</Code></Error>"))

    runtime.clients.s3.meta.events.register("before-send.s3.ListObjectsV2", back_while_failing)

    outcome = clean(stack, runtime)

    assert failed
    assert len(stack.objects(old["scratchPrefix"])) == 5
    assert old["grantId"] in stack.grant_ids()
    assert gateway.is_open(socket.connection_id) and not socket.closed
    assert statuses(outcome) == {
        "connection": ActionStatus.KEPT,
        "grant": ActionStatus.KEPT,
        "scratch": ActionStatus.KEPT,
    }
    socket.close()


def reconnect_during(
    stack: SessionStack, operation: str, old: dict[str, Any], runtime: Runtime, event: dict[str, Any] | None = None
) -> Outcome:
    """Clean the REMOVE of ``old`` while the user comes back (same key and resources) right after the first
    ``operation`` is answered: the next freeing call's permit, asked where it leaves, reads the session back."""
    event = event or stack.lambda_event()
    service = "kms" if operation == "RetireGrant" else "s3"
    client = runtime.clients.kms if service == "kms" else runtime.clients.s3
    back: list[bool] = []

    def reconnect(**_: object) -> None:
        if not back:
            back.append(True)
            stack.put_item(old)
            stack.s3.put_object(Bucket=stack.bucket, Key=f"{old['scratchPrefix']}new-session-data", Body=b"live")

    client.meta.events.register(f"after-call.{service}.{operation}", reconnect)
    outcomes = run_batch(read_lambda_event(event), runtime)
    return next(o for o in outcomes if o.event_name == "REMOVE")


def test_a_reread_that_finds_the_session_live_stops_every_later_step(
    stack: SessionStack, gateway: LocalGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("cleanup.actions.scratch.PAGE", 2)  # five objects: three pages
    socket = gateway.connect()
    old = stack.put_session("s1", objects=5, connection_id=socket.connection_id)
    stack.delete("s1")

    outcome = reconnect_during(stack, "DeleteObjects", old, stack.runtime(ws_callback_url=gateway.callback_url))

    assert gateway.is_open(socket.connection_id) and not socket.closed  # the live socket stays open
    assert old["grantId"] in stack.grant_ids()  # the live grant stays usable
    assert len(stack.objects(old["scratchPrefix"])) == 4  # the first page went before the user was back
    assert statuses(outcome)["scratch"] is ActionStatus.KEPT
    assert outcome.status is Status.FAILED and not outcome.permanent  # tried again against the item as it is now
    socket.close()


def test_the_next_delivery_after_a_stop_frees_only_what_the_new_item_does_not_hold(
    stack: SessionStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("cleanup.actions.scratch.PAGE", 2)
    old = stack.put_session("s1", objects=5)
    stack.delete("s1")
    event = stack.lambda_event()
    runtime = stack.runtime()
    new_grant = stack.kms.create_grant(
        KeyId=stack.key_arn, GranteePrincipal="arn:aws:iam::123456789012:role/agent", Operations=["Decrypt"]
    )["GrantId"]
    first = reconnect_during(stack, "DeleteObjects", {**old, "grantId": new_grant}, runtime, event)

    again = next(o for o in run_batch(read_lambda_event(event), runtime) if o.event_name == "REMOVE")

    assert first.status is Status.FAILED
    assert again.status is Status.CLEANED
    assert old["grantId"] not in stack.grant_ids() and new_grant in stack.grant_ids()
    assert len(stack.objects(old["scratchPrefix"])) == 4


@pytest.mark.parametrize("answer", ["{}", '{"Responses": {}}', '{"Responses": {"other-table": []}}'])
def test_an_answer_that_does_not_name_the_table_keeps_everything(
    stack: SessionStack, gateway: LocalGateway, answer: str
) -> None:
    socket = gateway.connect()
    old = stack.put_session("s1", objects=3, connection_id=socket.connection_id)
    stack.delete("s1")
    stack.put_item(old)  # re-put: the session is live again
    runtime = stack.runtime(ws_callback_url=gateway.callback_url, botocore_max_attempts=1)
    garble(runtime, answer)

    outcome = clean(stack, runtime)

    assert outcome.status is Status.FAILED and not outcome.permanent
    assert gateway.is_open(socket.connection_id) and not socket.closed
    assert old["grantId"] in stack.grant_ids()
    assert len(stack.objects(old["scratchPrefix"])) == 3
    socket.close()


def garble(runtime: Runtime, body: str) -> None:
    """Every BatchGetItem of ``runtime`` is answered 200 with ``body``, as a truncated answer can be read."""

    def answer(request: Any, **_: Any) -> AWSResponse:
        headers = {"Content-Type": "application/x-amz-json-1.0"}
        return AWSResponse(request.url, 200, headers, RawBody(body.encode()))

    runtime.clients.dynamodb.meta.events.register("before-send.dynamodb.BatchGetItem", answer)


# The rule itself, over scripts: the session comes back (as it was, or holding part of what it held) before any
# call, and any call may fail or be answered with garbage.
RECREATIONS = ("same", "new-grant", "inner-prefix", "outer-prefix", "elsewhere")


@st.composite
def scripts(draw: st.DrawFn, max_calls: int = 24) -> tuple[int, str, int | None, dict[int, str]]:
    objects = draw(st.integers(min_value=0, max_value=5))
    recreation = draw(st.sampled_from(RECREATIONS))
    recreate_at = draw(st.none() | st.integers(min_value=0, max_value=max_calls))
    faults = draw(st.dictionaries(st.integers(min_value=0, max_value=max_calls), st.sampled_from(FAULTS), max_size=4))
    return objects, recreation, recreate_at, faults


def recreated(stack: SessionStack, old: dict[str, Any], how: str) -> dict[str, Any]:
    prefix = old["scratchPrefix"]
    if how == "same":
        return dict(old)
    if how == "inner-prefix":
        return {**old, "scratchPrefix": f"{prefix}v2/"}
    if how == "outer-prefix":
        return {**old, "scratchPrefix": prefix.rsplit("/", 2)[0] + "/"}
    grant = stack.kms.create_grant(
        KeyId=stack.key_arn, GranteePrincipal="arn:aws:iam::123456789012:role/agent", Operations=["Decrypt"]
    )["GrantId"]
    if how == "new-grant":
        return {**old, "grantId": grant}
    return {**old, "grantId": grant, "connectionId": f"conn-{uuid.uuid4().hex[:8]}", "scratchPrefix": f"{prefix}x/"}


Conditions = tuple[bool, int, bool]
conditions = st.tuples(st.booleans(), st.sampled_from([1, 3]), st.booleans())
"""How the calls go: paced (every freeing service at a learnt 2 calls a second, so calls wait for their turns),
botocore's attempts (its own retries of what it may send again), and whether a kind that is not built in (``tokens``,
its resource named by an attribute of its own) is enabled beside the built-ins."""


def check_the_rule(
    stack: SessionStack,
    drawn: tuple[int, str, int | None, dict[int, str]],
    how_calls_go: Conditions = (False, 1, False),
) -> None:
    objects, how, recreate_at, faults = drawn
    paced, attempts, tokens = how_calls_go
    sid = uuid.uuid4().hex[:10]
    extra = {}
    if tokens:
        stack.ddb.put_item(TableName=stack.table, Item={**token_key(f"tok-{sid}"), "owner": {"S": sid}})
        extra = {"tokenId": f"tok-{sid}"}
    old = stack.put_session(sid, objects=objects, connection_id=f"conn-{sid}", extra=extra)
    stack.delete(sid)
    script = Script(recreate_at=recreate_at, recreated=recreated(stack, old, how), faults=dict(faults))
    runtime = scripted_runtime(stack, script, None, botocore_max_attempts=attempts)
    if paced:
        runtime.clients.pacer.seed(dict.fromkeys(("kms", "s3", "apigatewaymanagementapi"), 2.0))

    outcome = clean(stack, runtime)

    log = runtime.clients.log  # type: ignore[attr-defined]
    assert violations(log) == [], f"script {drawn} {how_calls_go}: {outcome.actions}"
    live = runtime.clients.live  # type: ignore[attr-defined]
    if outcome.status is Status.CLEANED and live is None:  # cleaned, and nobody came back: nothing of it is left
        assert stack.objects(old["scratchPrefix"]) == [] and old["grantId"] not in stack.grant_ids()
        if tokens:
            found = stack.ddb.get_item(TableName=stack.table, Key=token_key(f"tok-{sid}"), ConsistentRead=True)
            assert "Item" not in found


def test_a_read_is_judged_by_what_its_answer_carried(stack: SessionStack) -> None:
    # The session comes back on another thread after the table answered "no item" and before the answer is handled:
    # the calls that answer allowed were right to go, and the check must not call them violations.
    old = stack.put_session("s1", objects=3, connection_id="conn-s1")
    stack.delete("s1")
    runtime = scripted_runtime(stack, Script(), None)
    back: list[bool] = []

    def back_after_the_answer(**_: Any) -> None:
        if not back:
            back.append(True)
            stack.put_item(old)
            runtime.clients.live = old  # type: ignore[attr-defined]

    runtime.clients.dynamodb.meta.events.register_first("after-call.dynamodb.BatchGetItem", back_after_the_answer)

    outcome = clean(stack, runtime)

    log = runtime.clients.log  # type: ignore[attr-defined]
    assert back and any(event.kind == "destroy" for event in log)  # a call went on the answer "no item"
    assert violations(log) == [], f"{outcome.actions}"


@pytest.fixture
def with_tokens(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The built-ins and ``tokens`` enabled (a session without a token plans nothing of it)."""
    loading.register(Tokens)
    monkeypatch.setenv("ACTIONS", "connection,grant,scratch,tokens")
    yield
    loading.unregister(Tokens.name)


@given(drawn=scripts(), how_calls_go=conditions)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_no_destructive_call_destroys_what_the_live_item_held_at_the_read_that_allowed_it(
    stack: SessionStack,
    monkeypatch: pytest.MonkeyPatch,
    with_tokens: None,
    drawn: tuple[int, str, int | None, dict[int, str]],
    how_calls_go: Conditions,
) -> None:
    monkeypatch.setattr("cleanup.actions.scratch.PAGE", 2)
    check_the_rule(stack, drawn, how_calls_go)


@pytest.mark.slow
@pytest.mark.timeout(900)  # 100 scripts, half of them paced: 1-2 minutes, longer on a machine running two suites
@given(drawn=scripts(max_calls=40), how_calls_go=conditions)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_rule_holds_over_many_scripts(
    stack: SessionStack,
    monkeypatch: pytest.MonkeyPatch,
    with_tokens: None,
    drawn: tuple[int, str, int | None, dict[int, str]],
    how_calls_go: Conditions,
) -> None:
    monkeypatch.setattr("cleanup.actions.scratch.PAGE", 2)
    check_the_rule(stack, drawn, how_calls_go)


@pytest.mark.parametrize(
    ("service", "operation", "status", "body"),
    [
        ("kms", "RetireGrant", 400, b'{"__type": "ThrottlingException", "message": "slow down"}'),
        ("s3", "DeleteObjects", 503, b"<Error><Code>SlowDown</Code><Message>slow down</Message></Error>"),
    ],
)
def test_botocore_does_not_send_a_freeing_call_again_on_the_read_that_allowed_the_first_attempt(
    stack: SessionStack, service: str, operation: str, status: int, body: bytes
) -> None:
    # The default settings: botocore's standard retries are on (three attempts). The user is back while the first
    # attempt is answered with a throttle: the call is tried again only after a fresh read, which keeps it.
    old = stack.put_session("s1", objects=3)
    stack.delete("s1")
    runtime = stack.runtime()
    sent: list[int] = []

    def throttled_while_the_user_is_back(request: Any, event_name: str, **_: Any) -> AWSResponse | None:
        if not event_name.endswith(f".{operation}"):
            return None
        sent.append(1)  # after the permit's read, where the call leaves: the last hook of all
        if len(sent) > 1:
            return None
        stack.put_item(old)
        headers = {"x-amzn-ErrorType": "ThrottlingException", "Content-Type": "application/x-amz-json-1.1"}
        return AWSResponse(request.url, status, headers, RawBody(body))

    client = runtime.clients.kms if service == "kms" else runtime.clients.s3
    client.meta.events.register_last("before-send", throttled_while_the_user_is_back)

    outcome = clean(stack, runtime)

    assert sent == [1]  # never sent again: the fresh read found the session back
    assert old["grantId"] in stack.grant_ids()  # the grant goes after the scratch data: kept either way
    if operation == "DeleteObjects":
        assert len(stack.objects(old["scratchPrefix"])) == 3
    assert outcome.status is Status.FAILED and not outcome.permanent  # tried again against the item as it is now
