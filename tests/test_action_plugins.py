"""A kind of resource the worker does not ship (``tests.action_rows``: rows of the session's partition) is freed
through the action API, behind the same fence, and carried by the same backlog, as the built-ins are."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from cleanup.actions import loading
from cleanup.actions.api import ActionKind, Context, Gate, Holding, Step
from cleanup.deadline import Deadline
from cleanup.exceptions import ConfigurationError, NowHeldError
from cleanup.operations.redrive import redrive
from cleanup.queues.backlog import backlog_body
from cleanup.queues.deadletter import message_body
from cleanup.queues.integrity import seal
from cleanup.queues.reporting import run_batch
from schemas.outcomes import ActionResult, ActionStatus, Outcome, Status
from schemas.records import StreamRecord, read_lambda_event, read_record
from schemas.session import Session
from tests import schedule
from tests.action_rows import PartitionRows, Swallowing
from tests.queues import on_queue, send
from tests.schedule import Script, violations
from tests.stack import SessionStack, client
from tests.test_configuration import bad_env, in_lambda  # noqa: F401 - fixtures
from tests.test_drain import drain
from tests.test_fence import clean, recreated, scripted_runtime, scripts
from worker import lambda_handler

BUILT_IN = "connection,grant,scratch,registry"


@pytest.fixture
def rows(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The test kinds registered, and ``rows`` enabled after the built-ins, on the prefix ``draft#``."""
    loading.register(PartitionRows)
    loading.register(Swallowing)
    monkeypatch.setenv("ACTIONS", f"{BUILT_IN},rows")
    monkeypatch.setenv("ROWS_SORT_PREFIX", "draft#")
    yield
    loading.unregister("rows")
    loading.unregister("swallowing")


def put_rows(stack: SessionStack, session_id: str, sort_keys: list[str]) -> None:
    for sort_key in sort_keys:
        stack.put_item({"pk": f"session#{session_id}", "sk": sort_key, "note": "x"})


def sort_keys(stack: SessionStack, session_id: str) -> list[str]:
    found = stack.ddb.query(
        TableName=stack.table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": f"session#{session_id}"}},
        ConsistentRead=True,
    )
    return sorted(item["sk"]["S"] for item in found["Items"])


def removed(stack: SessionStack, runtime: Any) -> Outcome:
    outcomes = run_batch(read_lambda_event(stack.lambda_event()), runtime)
    [outcome] = [o for o in outcomes if o.event_name == "REMOVE"]
    return outcome


def test_a_plugin_frees_its_rows_of_a_deleted_session(stack: SessionStack, rows: None) -> None:
    stack.put_session("p1")
    put_rows(stack, "p1", [f"draft#{n:02d}" for n in range(30)] + ["profile"])
    put_rows(stack, "p2", ["draft#01"])
    stack.delete("p1")

    outcome = removed(stack, stack.runtime())

    assert outcome.status is Status.CLEANED
    assert {a.action: a.status for a in outcome.actions}["rows"] is ActionStatus.DONE
    assert sort_keys(stack, "p1") == ["profile"]  # only the prefix's rows, 30 of them in two BatchWriteItem calls
    assert sort_keys(stack, "p2") == ["draft#01"]  # another session's partition is not touched


def test_a_plugin_keeps_its_rows_when_the_session_is_back(stack: SessionStack, rows: None) -> None:
    session = stack.put_session("p3")
    put_rows(stack, "p3", ["draft#1", "draft#2"])
    stack.delete("p3")
    stack.put_item(session)  # re-created under the same key before its record is cleaned

    outcome = removed(stack, stack.runtime())

    assert {a.action: a.status for a in outcome.actions}["rows"] is ActionStatus.KEPT
    assert sort_keys(stack, "p3") == ["draft#1", "draft#2", "meta"]


def test_a_kind_that_swallows_the_permits_refusal_still_frees_nothing(
    stack: SessionStack, rows: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACTIONS", "swallowing")
    session = stack.put_session("p4")
    put_rows(stack, "p4", ["draft#1"])
    stack.delete("p4")
    stack.put_item(session)

    removed(stack, stack.runtime())

    assert sort_keys(stack, "p4") == ["draft#1", "meta"]  # the gate asked the permit before the call: never sent


def test_a_gate_makes_no_call_its_permit_refuses() -> None:
    sent: list[str] = []

    def refuse(deadline: object, reading: object) -> Any:
        raise NowHeldError("held")

    with pytest.raises(NowHeldError):
        Gate(refuse, "rows").call(Deadline(), sent.append, "delete")
    assert sent == []


def test_an_unknown_action_is_refused_at_start_in_one_line(stack: SessionStack, monkeypatch) -> None:
    monkeypatch.setenv("ACTIONS", f"{BUILT_IN},my-kind")

    with pytest.raises(ConfigurationError) as refused:
        stack.runtime()

    assert str(refused.value) == (
        "configuration error: ACTIONS: unknown action 'my-kind' "
        "(installed: connection, grant, http-close, registry, scratch)"
    )


class Rooms(ActionKind):
    name = "rooms"
    owns = ("connection_id",)
    paced_by = "dynamodb"

    def plan(self, session: Session, context: Context) -> list[Step]:
        return []

    def holding(self, resource: str, live: Session, location: Any) -> Holding:
        return Holding.UNKNOWN


def test_a_kind_owning_another_kinds_attribute_is_refused(stack: SessionStack, monkeypatch) -> None:
    loading.register(Rooms)
    try:
        monkeypatch.setenv("ACTIONS", f"{BUILT_IN},rooms")
        with pytest.raises(ConfigurationError, match="action 'rooms': owns 'connection_id', already owned by"):
            stack.runtime()
    finally:
        loading.unregister("rooms")


def test_attributes_spelt_alike_are_refused(stack: SessionStack) -> None:
    with pytest.raises(ConfigurationError, match="owns attribute 'pk'"):
        stack.runtime(attributes={"grant_id": "pk", "scratch_prefix": "pk"})


def test_a_kind_is_found_through_its_entry_point(stack: SessionStack, monkeypatch) -> None:
    point = EntryPoint(name="rows", value="tests.action_rows:PartitionRows", group=loading.GROUP)
    monkeypatch.setattr(loading, "entry_points", lambda group: [point, point] if group == loading.GROUP else [])
    loading._entry_points.cache_clear()
    loading.load_kinds.cache_clear()
    monkeypatch.setenv("ACTIONS", f"{BUILT_IN},rows")
    try:
        assert [kind.name for kind in stack.runtime().kinds] == [*BUILT_IN.split(","), "rows"]
    finally:
        loading._entry_points.cache_clear()
        loading.load_kinds.cache_clear()


def test_the_backlog_carries_a_plugins_remaining_work(worker_env, rows, capsys, monkeypatch) -> None:
    stack = worker_env
    url = str(client("sqs").create_queue(QueueName=f"backlog-{stack.table}")["QueueUrl"])
    monkeypatch.setenv("BACKLOG_QUEUE_URL", url)
    session = stack.put_session("p5", objects=0)
    put_rows(stack, "p5", ["draft#1", "draft#2"])
    stack.delete("p5")
    [raw] = [r for r in stack.new_records() if r["eventName"] == "REMOVE"]
    record = read_record(raw)
    assert isinstance(record, StreamRecord)
    stack.kms.retire_grant(KeyId=stack.key_arn, GrantId=session["grantId"])  # done before the rows were deferred
    done = [ActionResult(action=name, status=ActionStatus.DONE) for name in ("grant", "scratch")]
    waiting = ActionResult(action="rows", status=ActionStatus.FAILED, error="throttled")
    outcome = Outcome(sequence_number=record.sequence_number, status=Status.FAILED, actions=(*done, waiting))
    body = backlog_body(outcome, record, names=stack.runtime().settings.attributes)
    assert json.loads(body)["remaining"] == ["rows"]
    send(url, seal(body, stack.runtime()))

    code, summary = drain(capsys)

    assert (code, summary["done"]) == (0, 1)
    assert sort_keys(stack, "p5") == []  # the rows left were freed (what was done answers "already done")
    assert on_queue(url) == []


def test_a_deferred_record_names_the_plugin_among_its_actions(worker_env, rows, monkeypatch) -> None:
    stack = worker_env
    stack.put_session("p6")
    stack.delete("p6")
    [raw] = [r for r in stack.new_records() if r["eventName"] == "REMOVE"]
    record = read_record(raw)
    outcome = Outcome(sequence_number=record.sequence_number, status=Status.FAILED, error="no turn")

    body = backlog_body(outcome, record, actions=[kind.name for kind in stack.runtime().kind_classes])

    assert json.loads(body)["remaining"] == [*BUILT_IN.split(","), "rows"]


@given(drawn=scripts())
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_fence_rule_holds_for_the_plugin(
    stack: SessionStack, rows: None, monkeypatch: pytest.MonkeyPatch, drawn: tuple[int, str, int | None, dict[int, str]]
) -> None:
    # Only the plugin sends BatchWriteItem here (no registry): its calls are judged as its own.
    monkeypatch.setitem(schedule.ACTION_OF, "BatchWriteItem", "rows")
    monkeypatch.setattr("cleanup.actions.scratch.PAGE", 2)
    objects, how, recreate_at, faults = drawn
    sid = uuid.uuid4().hex[:10]
    old = stack.put_session(sid, objects=objects, connection_id=f"conn-{sid}")
    put_rows(stack, sid, ["draft#1", "draft#2", "draft#3"])
    stack.delete(sid)
    script = Script(recreate_at=recreate_at, recreated=recreated(stack, old, how), faults=dict(faults))
    runtime = scripted_runtime(stack, script, None)

    outcome = clean(stack, runtime)

    log = runtime.clients.log  # type: ignore[attr-defined]
    assert violations(log) == [], f"script {drawn}: {outcome.actions}"
    if outcome.status is Status.CLEANED and runtime.clients.live is None:  # type: ignore[attr-defined]
        assert sort_keys(stack, sid) == []


def test_a_dead_lettered_record_is_redriven_with_the_plugins_work(stack: SessionStack, rows: None) -> None:
    stack.put_session("p7", objects=0, grant=False, connection_id="conn-p7")
    put_rows(stack, "p7", ["draft#1", "draft#2"])
    stack.delete("p7")
    [raw] = [r for r in stack.new_records() if r["eventName"] == "REMOVE"]
    record = read_record(raw)
    assert isinstance(record, StreamRecord)
    outcome = Outcome(sequence_number=record.sequence_number, status=Status.FAILED, error="denied", permanent=True)
    runtime = stack.runtime(ws_callback_url=stack.aws.endpoint_url)
    body = seal(message_body(outcome, record, names=runtime.settings.attributes), runtime)

    result = redrive(body, runtime)

    assert result.settled and [o.status for o in result.outcomes] == [Status.CLEANED]
    assert sort_keys(stack, "p7") == []


@pytest.mark.usefixtures("in_lambda")
def test_a_lambda_with_an_unknown_action_fails_with_one_json_error_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], stack: SessionStack
) -> None:
    monkeypatch.setenv("SESSION_TABLE", stack.table)
    monkeypatch.setenv("ACTIONS", f"{BUILT_IN},my-kind")

    with pytest.raises(ConfigurationError) as failed:
        lambda_handler.handler({"Records": []}, None)

    [line] = capsys.readouterr().out.splitlines()
    logged = json.loads(line)
    assert logged["level"] == "ERROR" and logged["message"] == str(failed.value)
    assert logged["variables"] == {
        "ACTIONS": "unknown action 'my-kind' (installed: connection, grant, http-close, registry, scratch)"
    }
    assert not lambda_handler.warm.ready

    monkeypatch.setenv("ACTIONS", BUILT_IN)  # fixed: the next invocation reads the environment again
    assert lambda_handler.handler({"Records": []}, None) == {"batchItemFailures": []}
