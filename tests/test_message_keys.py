"""The integrity key of the worker's own messages over its lifetime: KMS answers that are cut are retries, never
verdicts; a rotated key keeps the messages in flight; a message naming a kind no longer configured frees the rest."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cleanup.deadline import Deadline
from cleanup.exceptions import TransientError
from cleanup.queues.backlog import backlog_body
from cleanup.queues.backlog_drain import Message, clean, dead_letter_target
from cleanup.queues.integrity import seal
from cleanup.queues.integrity_check import verify
from schemas.outcomes import Outcome, Status
from schemas.records import StreamRecord, read_record
from tests.faults import Cut, Faults
from tests.queues import on_queue, send
from tests.stack import SessionStack, client
from worker import cli, lambda_handler
from worker.local.gateway import LocalGateway


def new_queue(name: str, dead_letters: str | None = None) -> str:
    sqs = client("sqs")
    url = str(sqs.create_queue(QueueName=name)["QueueUrl"])
    if dead_letters is not None:
        arn = sqs.get_queue_attributes(QueueUrl=dead_letters, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 20})
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": policy})
    return url


def backlog_with_dead_letters(stack: SessionStack) -> tuple[str, str]:
    """A backlog queue and its dead-letter queue, named by its RedrivePolicy (as the template makes them)."""
    dead = new_queue(f"backlog-dlq-{stack.table}")
    return new_queue(f"backlog-{stack.table}", dead), dead


def held_message(stack: SessionStack, session: str, remaining: list[str] | None = None) -> str:
    """The backlog message of ``session``'s REMOVE, as the stream's worker defers it (``remaining``: the actions it
    names as left, all when None)."""
    [raw] = [raw for raw in stack.new_records() if raw["eventName"] == "REMOVE"]
    return tag_as_held(stack, raw, remaining)


def ended(stack: SessionStack, name: str) -> dict[str, Any]:
    session = stack.put_session(name)
    stack.delete(name)
    return session


def freed(stack: SessionStack, session: dict[str, Any]) -> bool:
    return session["grantId"] not in stack.grant_ids() and stack.objects(session["scratchPrefix"]) == []


def kept(stack: SessionStack, session: dict[str, Any]) -> bool:
    return session["grantId"] in stack.grant_ids() and len(stack.objects(session["scratchPrefix"])) == 3


@pytest.mark.parametrize("body", [b"", b'{"KeyId": "arn:aws:kms:us-east-1:123456789012:key/1", "MacVa'])
def test_a_cut_verify_mac_answer_keeps_the_message_for_later_and_never_calls_it_forged(
    stack: SessionStack, body: bytes
) -> None:
    session = ended(stack, "cut-verify")
    message = Message("m1", held_message(stack, "cut-verify"), "rh")
    backlog, dead = backlog_with_dead_letters(stack)
    runtime = stack.runtime(backlog_queue_url=backlog)
    Cut(runtime.clients.kms, "VerifyMac", body)

    left = clean([message], runtime, Deadline.after(30))

    assert left == [message] and on_queue(dead) == []  # kept in the backlog, not moved as a forgery
    assert kept(stack, session)
    assert clean([message], runtime, Deadline.after(30)) == [] and freed(stack, session)  # KMS answers: cleaned


def test_a_cut_generate_mac_answer_leaves_the_record_failed_and_reported_not_the_batch_crashed(
    stack: SessionStack,
) -> None:
    session = ended(stack, "cut-generate")
    event = stack.lambda_event()
    backlog = new_queue(f"backlog-{stack.table}")
    runtime = stack.runtime(backlog_queue_url=backlog)
    Faults(runtime.clients.kms, "RetireGrant", "KMSInternalException", status=500, times=1000)  # deferred: transient
    Cut(runtime.clients.kms, "GenerateMac", times=1000)  # ... but its message cannot be tagged

    with lambda_handler.warm.use(runtime):
        answer = lambda_handler.handler(event, None)

    [removal] = [r["dynamodb"]["SequenceNumber"] for r in event["Records"] if r["eventName"] == "REMOVE"]
    assert answer == {"batchItemFailures": [{"itemIdentifier": removal}]}  # reported: the stream delivers it again
    assert stack.objects(session["scratchPrefix"]) == [] and session["grantId"] in stack.grant_ids()
    assert on_queue(backlog) == []


def test_a_cut_describe_table_answer_is_a_transient_error(stack: SessionStack) -> None:
    runtime = stack.runtime()
    Cut(runtime.clients.dynamodb, "DescribeTable")

    with pytest.raises(TransientError, match=r"DescribeTable: the answer carries no usable Table\.KeySchema"):
        runtime.table_keys(stack.table)
    assert runtime.table_keys(stack.table) == ("pk", "sk")  # nothing was kept of the cut answer


def test_a_cut_get_queue_url_answer_keeps_a_refused_message_in_the_backlog(stack: SessionStack) -> None:
    backlog, dead = backlog_with_dead_letters(stack)
    runtime = stack.runtime(backlog_queue_url=backlog)
    refused = Message("bad", '{"format": "session-cleanup.dead-letter.v1"}', "rh-bad")
    Cut(runtime.clients.sqs, "GetQueueUrl", times=1000)

    with pytest.raises(TransientError, match="GetQueueUrl"):
        dead_letter_target(runtime, Deadline.after(10))
    left = clean([refused], runtime, Deadline.after(30))

    assert left == [refused] and on_queue(dead) == []  # kept where it is, moved once SQS answers


def hmac_key(stack: SessionStack) -> str:
    """A new HMAC key: what a rotation makes INTEGRITY_KEY_ID."""
    made = stack.kms.create_key(Description="rotated", KeySpec="HMAC_256", KeyUsage="GENERATE_VERIFY_MAC")
    return str(made["KeyMetadata"]["Arn"])


def test_a_message_tagged_with_a_previous_key_is_trusted_after_a_rotation(stack: SessionStack) -> None:
    session = ended(stack, "rotated")
    message = Message("m1", held_message(stack, "rotated"), "rh")  # tagged with the key in use before
    backlog, dead = backlog_with_dead_letters(stack)
    rotated = hmac_key(stack)
    runtime = stack.runtime(
        backlog_queue_url=backlog, integrity_key_id=rotated, integrity_previous_key_ids=stack.mac_key_arn
    )

    left = clean([message], runtime, Deadline.after(30))

    assert left == [] and on_queue(dead) == []
    assert freed(stack, session)


def test_a_previous_key_alone_never_vouches_for_a_message(stack: SessionStack) -> None:
    session = ended(stack, "no-current")
    message = Message("m1", held_message(stack, "no-current"), "rh")
    backlog, dead = backlog_with_dead_letters(stack)
    runtime = stack.runtime(
        backlog_queue_url=backlog, integrity_key_id=None, integrity_previous_key_ids=stack.mac_key_arn
    )

    assert clean([message], runtime, Deadline.after(30)) == [] and on_queue(dead) == [message.body]
    assert kept(stack, session)


def test_retag_tags_the_messages_of_a_queue_again_with_the_new_key_and_keeps_what_it_cannot_vouch_for(
    worker_env: SessionStack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = worker_env
    sessions = [ended(stack, "old-1"), ended(stack, "old-2")]
    [first, second] = [raw for raw in stack.new_records() if raw["eventName"] == "REMOVE"]
    tagged = [tag_as_held(stack, raw) for raw in (first, second)]
    forged = json.dumps({**json.loads(tagged[0]), "remaining": ["grant"]})  # changed after tagging
    on_failure = json.dumps({"DDBStreamBatchInfo": {"streamArn": stack.stream_arn, "shardId": "s"}})
    queue = new_queue(f"retag-{stack.table}")
    send(queue, *tagged, forged, on_failure)
    rotated = hmac_key(stack)
    monkeypatch.setenv("INTEGRITY_KEY_ID", rotated)
    monkeypatch.setenv("INTEGRITY_PREVIOUS_KEY_IDS", stack.mac_key_arn)

    code = cli.main(["retag", "--queue-url", queue, "--wait-seconds", "0", "--json"])

    summary = json.loads(capsys.readouterr().out)
    assert code == 1 and (summary["retagged"], summary["untagged"], summary["refused"]) == (2, 1, 1)
    left = on_queue(queue)
    assert forged in left and on_failure in left and len(left) == 4  # nothing lost, the forged one kept as it was
    only_new = stack.runtime(integrity_key_id=rotated)
    retagged = [Message(f"m{n}", body, "rh") for n, body in enumerate(left) if body not in (forged, on_failure)]
    assert [verify(json.loads(message.body), only_new) for message in retagged] == [rotated, rotated]
    assert clean(retagged, only_new, Deadline.after(30)) == []  # the previous key no longer needed
    assert all(freed(stack, session) for session in sessions)


def tag_as_held(stack: SessionStack, raw: dict[str, Any], remaining: list[str] | None = None) -> str:
    """``raw``'s backlog message, tagged with the stack's integrity key."""
    record = read_record(raw)
    assert isinstance(record, StreamRecord)
    outcome = Outcome(sequence_number=record.sequence_number, status=Status.DEFERRED, error="no turn")
    body = json.loads(backlog_body(outcome, record))
    if remaining is not None:
        body["remaining"] = remaining
    return seal(json.dumps(body), stack.runtime())


def test_a_message_held_for_connection_is_cleaned_by_http_close_once_the_deployment_switched(
    stack: SessionStack, gateway: LocalGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Paused with ACTIONS' default, switched to http-close as docs/actions.md recommends, resumed.
    socket = gateway.connect()
    session = stack.put_session("switched", connection_id=socket.connection_id)
    stack.delete("switched")
    message = Message("m1", held_message(stack, "switched", ["connection", "grant", "scratch", "registry"]), "rh")
    monkeypatch.setenv("ACTIONS", "http-close,grant,scratch,registry")
    monkeypatch.setenv("CLOSE_URL", f"{gateway.callback_url}/@connections/{{connectionId}}")
    monkeypatch.setenv("ALLOWED_CLOSE_HOSTS", "127.0.0.1")
    backlog, dead = backlog_with_dead_letters(stack)

    left = clean([message], stack.runtime(backlog_queue_url=backlog), Deadline.after(30))

    assert left == [] and on_queue(dead) == []
    assert gateway.wait_gone(socket.connection_id) and freed(stack, session)


def test_a_kind_no_longer_configured_is_reported_as_its_own_failure_and_the_others_are_freed(
    stack: SessionStack,
) -> None:
    session = ended(stack, "plugin-gone")
    message = Message("m1", held_message(stack, "plugin-gone", ["rooms-plugin", "grant", "scratch"]), "rh")
    backlog, dead = backlog_with_dead_letters(stack)
    letters = new_queue(f"dead-letters-{stack.table}")
    runtime = stack.runtime(backlog_queue_url=backlog, dead_letter_queue_url=letters)

    left = clean([message], runtime, Deadline.after(30))

    assert left == [] and on_queue(dead) == []  # done: its record is dead-lettered for the kind left
    assert freed(stack, session)
    [letter] = [json.loads(body) for body in on_queue(letters)]
    failed = [action for action in letter["actions"] if action["status"] == "failed"]
    assert [(a["action"], a["permanent"]) for a in failed] == [("rooms-plugin", True)]
    assert "not in ACTIONS" in failed[0]["error"]
