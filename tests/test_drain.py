"""``cleanup-worker drain``: the backlog's messages are cleaned through the same core, hours late or not; a message
goes only once its record is clean, a re-created session keeps its grant, and a stored record's object goes with
its message."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from cleanup.aws.retry import Deadline
from cleanup.backlog import backlog_body
from cleanup.backlog_drain import Message, clean
from cleanup.deadletter import stored_letter
from schemas.outcomes import ActionResult, ActionStatus, Outcome, Status
from schemas.records import StreamRecord, read_record
from schemas.settings import AttributeNames
from tests.queues import on_queue, send
from tests.stack import SessionStack, client
from worker import cli


@pytest.fixture
def backlog(worker_env: SessionStack, monkeypatch: pytest.MonkeyPatch) -> str:
    url = str(client("sqs").create_queue(QueueName=f"backlog-{worker_env.table}")["QueueUrl"])
    monkeypatch.setenv("BACKLOG_QUEUE_URL", url)
    return url


def deferred(stack: SessionStack) -> list[tuple[StreamRecord, str]]:
    """Each new REMOVE record and its backlog message, as the stream's worker defers it (every action left)."""
    found = []
    for raw in stack.new_records():
        record = read_record(raw)
        if isinstance(record, StreamRecord) and raw["eventName"] == "REMOVE":
            outcome = Outcome(sequence_number=record.sequence_number, status=Status.DEFERRED, error="no turn")
            found.append((record, backlog_body(outcome, record)))
    return found


def drain(capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = cli.main(["drain", "--until-idle", "--wait", "0", "--visibility", "30"])
    return code, json.loads(capsys.readouterr().out.splitlines()[-1])


def test_a_deferred_record_is_cleaned_and_its_message_deleted(worker_env, backlog, capsys):
    stack = worker_env
    session = stack.put_session("d1")
    stack.delete("d1")
    send(backlog, *(body for _, body in deferred(stack)))

    code, summary = drain(capsys)

    assert (code, summary["done"], summary["released"]) == (0, 1, 0)
    assert session["grantId"] not in stack.grant_ids() and stack.objects(session["scratchPrefix"]) == []
    assert on_queue(backlog) == []


def test_a_session_re_created_while_its_record_waits_keeps_its_grant(worker_env, backlog, capsys):
    stack = worker_env
    session = stack.put_session("again")
    stack.delete("again")
    messages = [body for _, body in deferred(stack)]
    stack.put_item(session)  # the user came back: the same key, the same grant, hours before the drain
    send(backlog, *messages)

    code, summary = drain(capsys)

    assert (code, summary["done"]) == (0, 1)
    assert session["grantId"] in stack.grant_ids()  # the fence read the live item: kept
    assert len(stack.objects(session["scratchPrefix"])) == 3
    assert on_queue(backlog) == []


def test_a_stored_records_object_is_deleted_once_the_record_is_clean(worker_env, backlog, capsys):
    stack = worker_env
    session = stack.put_session("big")
    stack.delete("big")
    [(_, body)] = deferred(stack)
    letter = stored_letter(0, body, stack.runtime(), limit=len(body) - 1, deadline=Deadline.after(10))
    assert letter is not None and letter.stored and stack.objects(letter.stored) == [letter.stored]
    send(backlog, letter.body)

    code, summary = drain(capsys)

    assert (code, summary["done"]) == (0, 1)
    assert session["grantId"] not in stack.grant_ids()
    assert stack.objects(letter.stored) == []  # its marker stays beside it, under redriven/
    assert on_queue(backlog) == []


def test_a_message_whose_record_cannot_be_cleaned_now_is_released_not_deleted(worker_env, backlog, capsys, monkeypatch):
    stack = worker_env
    stack.put_session("later")
    stack.delete("later")
    [(_, body)] = deferred(stack)
    send(backlog, body)
    monkeypatch.setenv("KMS_KEY_ID", stack.key_arn.replace(stack.key_arn[-4:], "0000"))  # the grant's key refused

    code, summary = drain(capsys)

    assert (code, summary["released"], summary["done"]) == (1, 1, 0)
    names: Any = ["ApproximateNumberOfMessagesNotVisible"]
    hidden = client("sqs").get_queue_attributes(QueueUrl=backlog, AttributeNames=names)["Attributes"]
    assert hidden["ApproximateNumberOfMessagesNotVisible"] == "1"  # released for a minute, not deleted


def test_a_deferred_grant_of_a_table_keyed_by_its_connection_is_retired(stack: SessionStack) -> None:
    # ATTR_CONNECTION_ID=pk (README, "Tables whose partition holds more than the session row"): the socket is closed,
    # the grant deferred. Cutting the done connection out of the image would cut the key: it stays, and the drain
    # retires the grant (closing the socket again answers "already closed").
    grant = stack.kms.create_grant(
        KeyId=stack.key_arn, GranteePrincipal="arn:aws:iam::123456789012:role/agent", Operations=["Decrypt"]
    )["GrantId"]
    stack.put_item({"pk": "conn#abc123", "sk": "metadata", "grantId": grant, "expires_at": int(time.time()) - 10})
    stack.ddb.delete_item(TableName=stack.table, Key={"pk": {"S": "conn#abc123"}, "sk": {"S": "metadata"}})
    [raw] = [r for r in stack.new_records() if r["eventName"] == "REMOVE"]
    record = read_record(raw)
    assert isinstance(record, StreamRecord)
    done = ActionResult(action="connection", status=ActionStatus.DONE)
    waiting = ActionResult(action="grant", status=ActionStatus.FAILED)
    outcome = Outcome(sequence_number=record.sequence_number, status=Status.FAILED, actions=(done, waiting))
    runtime = stack.runtime(
        attributes=AttributeNames(connection_id="pk", ttl="expires_at"),
        session_sort_key="metadata",
        ws_callback_url=stack.aws.endpoint_url,
        session_binding=False,  # a grant not named for a session
    )

    left = clean([Message("m1", backlog_body(outcome, record), "rh")], runtime, Deadline.after(30))

    assert left == []
    assert grant not in stack.grant_ids()
