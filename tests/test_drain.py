"""``cleanup-worker drain``: the backlog's messages are cleaned through the same core, hours late or not; a message
goes only once its record is clean, a re-created session keeps its grant, and a stored record's object goes with
its message."""

from __future__ import annotations

import io
import json
import math
import threading
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cleanup.aws.clients import Clients
from cleanup.deadline import Deadline
from cleanup.queues.backlog import MAX_PACED, SERVICE_NAME, backlog_body, defer, pace_hint
from cleanup.queues.backlog_drain import Message, clean
from cleanup.queues.deadletter import stored_letter
from cleanup.queues.integrity import seal
from cleanup.runtime import Runtime
from cleanup.telemetry import Metrics, MetricsSink
from schemas.outcomes import ActionResult, ActionStatus, Outcome, Status
from schemas.records import StreamRecord, read_record
from schemas.settings import AttributeNames
from tests.queues import on_queue, send
from tests.stack import SessionStack, client, to_av
from tests.strategies import bodies, json_values, scalars
from worker import cli

PACE_NAMES = ["kms", "s3", "dynamodb-streams", "dynamodb-control", "kms-GenerateMac", "KMS", "a" * 41]


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
            found.append((record, seal(backlog_body(outcome, record), stack.runtime())))
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
    # ATTR_CONNECTION_ID=pk (docs/configure.md, "A connection table"): the socket is closed,
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

    body = seal(backlog_body(outcome, record, names=runtime.settings.attributes), runtime)

    left = clean([Message("m1", body, "rh")], runtime, Deadline.after(30))

    assert left == []
    assert grant not in stack.grant_ids()


@pytest.fixture
def backlog_dlq(backlog: str) -> str:
    """The backlog's dead-letter queue, named by the backlog's RedrivePolicy (as the template makes it)."""
    sqs = client("sqs")
    url = str(sqs.create_queue(QueueName=backlog.rsplit("/", 1)[-1] + "-dlq")["QueueUrl"])
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 20})
    sqs.set_queue_attributes(QueueUrl=backlog, Attributes={"RedrivePolicy": policy})
    return url


def ghost_image(live: dict[str, Any]) -> dict[str, Any]:
    """An image of a key no item has, naming ``live``'s resources (what a forger would write)."""
    return to_av({**live, "pk": "session#ghost", "sk": "meta"})


def test_a_stored_record_overwritten_to_name_a_live_session_frees_nothing(
    worker_env: SessionStack, backlog: str, backlog_dlq: str, capsys: pytest.CaptureFixture[str]
) -> None:
    stack = worker_env
    live = stack.put_session("live")
    ended = stack.put_session("ended")
    stack.delete("ended")
    [(_, body)] = deferred(stack)
    letter = stored_letter(0, body, stack.runtime(), limit=len(body) - 1, deadline=Deadline.after(10))
    assert letter is not None and letter.stored
    whole = json.loads(stack.s3.get_object(Bucket=stack.bucket, Key=letter.stored)["Body"].read())
    whole["record"]["dynamodb"]["Keys"] = ghost_image({"pk": "", "sk": ""})
    whole["record"]["dynamodb"]["OldImage"] = ghost_image(live)
    stack.s3.put_object(Bucket=stack.bucket, Key=letter.stored, Body=json.dumps(whole).encode())
    send(backlog, letter.body)

    code, summary = drain(capsys)

    assert live["grantId"] in stack.grant_ids() and len(stack.objects(live["scratchPrefix"])) == 3
    assert ended["grantId"] in stack.grant_ids()  # its record cannot be vouched for: kept for an operator
    assert stack.objects(letter.stored) == [letter.stored]
    assert on_queue(backlog) == [] and on_queue(backlog_dlq) == [letter.body]
    assert (code, summary["done"]) == (0, 1)  # done here: moved, whole, to the backlog's dead-letter queue


def test_a_malformed_message_fails_alone_and_its_batch_is_done(
    worker_env: SessionStack, backlog: str, backlog_dlq: str
) -> None:
    stack = worker_env
    ended = stack.put_session("ended")
    stack.delete("ended")
    [(_, good)] = deferred(stack)
    settings = stack.settings(backlog_queue_url=backlog)
    out = io.StringIO()
    runtime = Runtime(settings, Clients(settings), Metrics(settings, MetricsSink("stdout", stream=out)))
    untagged = {name: value for name, value in json.loads(good).items() if name != "integrity"}
    bad = seal(json.dumps({**untagged, "remaining": [["grant"]]}), runtime)  # tagged: its shape alone is wrong
    messages = [Message("bad", bad, "rh-bad"), Message("good", good, "rh-good")]

    left = clean(messages, runtime, Deadline.after(30))

    assert left == []
    assert ended["grantId"] not in stack.grant_ids()
    assert on_queue(backlog_dlq) == [bad]
    refusals = [json.loads(line) for line in out.getvalue().splitlines() if "MessagesRefused" in line]
    assert [(doc["Reason"], doc["MessagesRefused"]) for doc in refusals] == [("unreadable", 1)]


@pytest.mark.slow
def test_any_unreadable_message_fails_alone_beside_a_good_one(
    worker_env: SessionStack, backlog: str, backlog_dlq: str
) -> None:
    stack = worker_env
    ended = stack.put_session("ended")
    stack.delete("ended")
    [(_, good)] = deferred(stack)
    runtime = stack.runtime(backlog_queue_url=backlog)

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(bodies(good))
    def one_bad_in_a_batch(bad: str) -> None:
        left = clean([Message("bad", bad, "rh-bad"), Message("good", good, "rh-good")], runtime, Deadline.after(30))
        assert left == []  # the good one cleaned, the bad one moved to the backlog's dead-letter queue

    one_bad_in_a_batch()
    assert ended["grantId"] not in stack.grant_ids()


def test_a_dry_run_moves_no_refused_message(worker_env: SessionStack, backlog: str, backlog_dlq: str) -> None:
    runtime = worker_env.runtime(backlog_queue_url=backlog, cleanup_mode="dry-run")
    refused = Message("bad", '{"format": "session-cleanup.dead-letter.v1"}', "rh-bad")

    left = clean([refused], runtime, Deadline.after(30))

    assert left == [refused] and on_queue(backlog_dlq) == []


@pytest.mark.parametrize("key", ["set", None])
def test_a_record_is_deferred_only_to_a_backlog_whose_messages_the_drain_can_verify(
    stack: SessionStack, key: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    stack.put_session("s1")
    stack.delete("s1")
    [record] = [read_record(raw) for raw in stack.new_records() if raw["eventName"] == "REMOVE"]
    assert isinstance(record, StreamRecord)
    queue = str(client("sqs").create_queue(QueueName=f"verifiable-{key}-{stack.table}")["QueueUrl"])
    runtime = stack.runtime(backlog_queue_url=queue, **({} if key else {"integrity_key_id": None}))
    waiting = Outcome(sequence_number=record.sequence_number, status=Status.FAILED, error="no turn")

    [outcome] = defer([waiting], [record], runtime, deadline=Deadline.after(30))

    if key:
        assert outcome.status is Status.DEFERRED and len(on_queue(queue)) == 1
    else:  # failed, so the stream delivers it again, rather than in a queue whose drain would refuse it
        assert outcome.status is Status.FAILED and on_queue(queue) == []
        assert "BACKLOG_QUEUE_URL is set without INTEGRITY_KEY_ID" in caplog.text


def test_a_batchs_messages_are_verified_together(stack: SessionStack) -> None:
    # Each message's tag costs a KMS call before anything it names is freed; one after the other, a batch's first
    # grant waited for every message's call. Here each VerifyMac goes on only once the other is in flight too.
    names = ["together-1", "together-2"]
    ended = [stack.put_session(name) for name in names]
    for name in names:
        stack.delete(name)
    messages = [Message(f"m{index}", body, f"rh{index}") for index, (_, body) in enumerate(deferred(stack))]
    runtime = stack.runtime()
    both = threading.Barrier(2, timeout=10)

    def in_flight_together(**_: Any) -> None:
        both.wait()

    runtime.clients.kms.meta.events.register("before-send.kms.VerifyMac", in_flight_together)

    left = clean(messages, runtime, Deadline.after(60))

    assert len(messages) == 2 and left == [] and not both.broken
    assert not {session["grantId"] for session in ended} & set(stack.grant_ids())


def learnt(runtime: Runtime, service: str) -> float | None:
    """The limit ``runtime``'s process has learnt for ``service``, after answers that say it is over a quota."""
    rate = runtime.clients.pacer.gate(service).rate
    sent = time.monotonic()
    for index in range(24):
        rate.answered(sent, throttled=index >= 6)  # 6 accepted, 18 throttled: cut to just under 6 a second
    return rate.limit


@pytest.mark.parametrize("environments", [1, 2, 3])
def test_a_cold_drain_starts_at_its_share_of_the_rate_the_deferring_worker_learnt(
    stack: SessionStack, environments: int
) -> None:
    # The stream's worker defers for want of a RetireGrant turn: the quota is spent. A new drain process that started
    # unpaced would spend its first burst on throttled answers before it could cut; it starts at the sender's rate,
    # shared among the drain's environments at once (BACKLOG_MAXIMUM_CONCURRENCY), each of which learns apart.
    session = stack.put_session("paced")
    stack.delete("paced")
    [record] = [read_record(raw) for raw in stack.new_records() if raw["eventName"] == "REMOVE"]
    assert isinstance(record, StreamRecord)
    queue = str(client("sqs").create_queue(QueueName=f"paced-{stack.table}")["QueueUrl"])
    sender = stack.runtime(backlog_queue_url=queue)
    pace = learnt(sender, "kms")
    waiting = Outcome(sequence_number=record.sequence_number, status=Status.FAILED, error="no turn")
    defer([waiting], [record], sender, deadline=Deadline.after(30))
    [body] = on_queue(queue)
    drainer = stack.runtime(backlog_maximum_concurrency=environments)

    left = clean([Message("m1", body, "rh")], drainer, Deadline.after(30))

    assert pace is not None and json.loads(body)["pace"] == {"kms": pytest.approx(pace, abs=0.001)}
    assert left == [] and session["grantId"] not in stack.grant_ids()
    assert drainer.clients.pacer.gate("kms").rate.limit == pytest.approx(pace / environments, rel=0.1)


def test_a_pace_changed_after_tagging_is_refused_with_its_message(stack: SessionStack) -> None:
    session = stack.put_session("forged-pace")
    stack.delete("forged-pace")
    [(_, body)] = deferred(stack)
    forged = json.dumps({**json.loads(body), "pace": {"kms": 1.0}})
    drainer = stack.runtime()

    left = clean([Message("m1", forged, "rh")], drainer, Deadline.after(30))

    assert session["grantId"] in stack.grant_ids()  # refused: nothing freed, and the message kept for an operator
    assert [message.body for message in left] == [forged]
    assert drainer.clients.pacer.gate("kms").rate.limit is None


@given(pace=json_values | st.dictionaries(st.sampled_from(PACE_NAMES) | st.text(max_size=8), scalars, max_size=10))
@settings(max_examples=300, deadline=None)
def test_a_pace_is_taken_only_as_far_as_it_is_understood(pace: Any) -> None:
    hint = pace_hint({"pace": pace})

    assert len(hint) <= MAX_PACED
    for name, rate in hint.items():
        assert SERVICE_NAME.fullmatch(name) and not name.endswith("-control")
        assert isinstance(rate, float) and math.isfinite(rate) and rate > 0


def test_a_pace_keeps_only_the_rates_of_services_own_quotas() -> None:
    pace = {"kms": 2.5, "s3": 7, "kms-GenerateMac": 3.0, "dynamodb-control": 2.0, "sqs": True, "x": "3", "y": -1}

    assert pace_hint({"pace": pace}) == {"kms": 2.5, "s3": 7.0}
    assert pace_hint({"pace": {"kms": 10**400}}) == {}
    assert pace_hint({"pace": [["kms", 2.5]]}) == {}
