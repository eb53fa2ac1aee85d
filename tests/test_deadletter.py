"""Dead-letter messages that fit SQS: batches sized by bytes, and records too large for a message stored in S3."""

from __future__ import annotations

import json
import logging
import re
import time
from collections import Counter
from typing import Any

import pytest

from cleanup.deadline import Deadline
from cleanup.queues.deadletter import SQS_BATCH_BYTES, Letter, batches, dead_letter, message_size
from cleanup.queues.integrity import seal
from cleanup.queues.reporting import run_batch
from cleanup.runtime import Runtime
from schemas.records import read_lambda_event
from tests.faults import Faults
from tests.queues import redrive
from tests.stack import SessionStack, client
from worker import cli, lambda_handler

LARGE = 147_000  # bytes of one item attribute: ten such records are over 1 MiB together
EMOJI = "\N{GRINNING FACE}"  # 4 bytes in UTF-8, 12 in ASCII JSON ("\ud83d\ude00")
HUGE = 390_000 // len(EMOJI.encode())  # characters: a 390 KB item attribute, more than 1 MiB as a message
UNSAFE = "sessions/../etc/"  # the guard refuses it: a permanent failure


def new_queue(stack: SessionStack, **attributes: str) -> str:
    sqs = client("sqs")
    return str(sqs.create_queue(QueueName=f"dlq-{stack.table}", Attributes=attributes)["QueueUrl"])


def messages(queue: str) -> list[dict[str, Any]]:
    """Every message on the queue, left there (visible again at once)."""
    sqs, found = client("sqs"), {}
    while True:
        answer = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, VisibilityTimeout=0)
        received = answer.get("Messages", [])
        fresh = {m["MessageId"]: json.loads(m["Body"]) for m in received if m["MessageId"] not in found}
        if not fresh:
            return list(found.values())
        found.update(fresh)


def counted(runtime: Runtime) -> Counter[str]:
    """The runtime's SQS calls, counted by operation as they are sent."""
    calls: Counter[str] = Counter()
    runtime.clients.sqs.meta.events.register("before-call.sqs", lambda model, **_: calls.update([model.name]))
    return calls


def invoke(runtime: Runtime, event: dict[str, Any]) -> dict[str, Any]:
    with lambda_handler.warm.use(runtime):
        return lambda_handler.handler(event, None)


def removes(event: dict[str, Any]) -> list[dict[str, Any]]:
    return [record for record in event["Records"] if record["eventName"] == "REMOVE"]


def test_ten_large_permanent_failures_in_one_batch_are_all_dead_lettered(stack: SessionStack) -> None:
    queue = new_queue(stack)
    for n in range(10):
        stack.put_session(f"big{n}", objects=0, grant=False, extra={"scratchPrefix": UNSAFE, "tenantId": "x" * LARGE})
        stack.delete(f"big{n}")
    event = stack.lambda_event()
    runtime = stack.runtime(dead_letter_queue_url=queue)
    calls = counted(runtime)

    assert invoke(runtime, event) == {"batchItemFailures": []}

    sent = messages(queue)
    assert sorted(m["sequenceNumber"] for m in sent) == sorted(r["dynamodb"]["SequenceNumber"] for r in removes(event))
    assert all(m["record"] in removes(event) for m in sent)
    assert calls["SendMessageBatch"] >= 2
    assert stack.objects("dead-letter/") == []  # each fits in a message: nothing stored


def test_batches_hold_at_most_ten_messages_and_one_mebibyte() -> None:
    sizes = [147_000] * 10 + [1_048_576, 10, 10] + [100] * 12
    letters = [Letter(index, "x" * size) for index, size in enumerate(sizes)]

    made = list(batches(letters))

    assert [[letter.index for letter in batch] for batch in made][:4] == [
        [0, 1, 2, 3, 4, 5, 6],
        [7, 8, 9],
        [10],
        [11, 12, 13, 14, 15, 16, 17, 18, 19, 20],
    ]
    assert [letter.index for batch in made for letter in batch] == list(range(len(sizes)))
    assert all(len(batch) <= 10 and sum(letter.size for letter in batch) <= SQS_BATCH_BYTES for batch in made)


def test_a_message_is_counted_in_utf8_bytes_and_sent_as_ascii_json(stack: SessionStack) -> None:
    queue = new_queue(stack)
    stack.put_session("accents", objects=0, grant=False, extra={"scratchPrefix": UNSAFE, "tenantId": "é" * 1000})
    stack.delete("accents")
    runtime = stack.runtime(dead_letter_queue_url=queue)

    assert invoke(runtime, stack.lambda_event()) == {"batchItemFailures": []}

    [raw] = client("sqs").receive_message(QueueUrl=queue)["Messages"]
    assert raw["Body"].isascii() and "\\u00e9" * 1000 in raw["Body"]
    assert message_size(raw["Body"]) == len(raw["Body"])
    assert json.loads(raw["Body"])["record"]["dynamodb"]["OldImage"]["tenantId"] == {"S": "é" * 1000}


def test_the_queues_maximum_message_size_is_read_once_and_decides_what_is_stored(stack: SessionStack) -> None:
    queue = new_queue(stack, MaximumMessageSize="4096")
    runtime = stack.runtime(dead_letter_queue_url=queue)
    calls = counted(runtime)
    for name, size in (("small", 10), ("medium", 5_000)):
        stack.put_session(name, objects=0, grant=False, extra={"scratchPrefix": UNSAFE, "tenantId": "x" * size})
        stack.delete(name)
        assert invoke(runtime, stack.lambda_event()) == {"batchItemFailures": []}

    small, medium = messages(queue)
    assert "record" in small and "recordObject" not in small
    assert "record" not in medium and medium["recordObject"]["bucket"] == stack.bucket
    assert calls["GetQueueAttributes"] == 1


def test_a_record_too_large_for_a_message_goes_through_s3_and_redrive_cleans_it(
    worker_env: SessionStack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = worker_env
    queue = new_queue(stack)
    item = stack.put_session("huge", tenant=EMOJI * HUGE, prefix="sessions/huge/")
    stack.delete("huge")
    event = stack.lambda_event()
    [record] = removes(event)
    # No key to retire the grant with: a permanent failure, until KMS_KEY_ID is set.
    runtime = stack.runtime(dead_letter_queue_url=queue, kms_key_id=None)

    assert invoke(runtime, event) == {"batchItemFailures": []}

    [stored] = stack.objects("dead-letter/")
    [message] = messages(queue)
    whole = json.loads(stack.s3.get_object(Bucket=stack.bucket, Key=stored)["Body"].read())
    assert len(json.dumps(record)) > 1_048_576  # as JSON the record alone is over SQS's largest message
    assert re.fullmatch(r"dead-letter/\d{4}/\d\d/\d\d/\d+-[0-9a-f]{32}\.json", stored)
    assert message["recordObject"] == {"bucket": stack.bucket, "key": stored}
    assert {name: message[name] for name in ("sequenceNumber", "eventID", "source", "error", "actions")} == {
        name: whole[name] for name in ("sequenceNumber", "eventID", "source", "error", "actions")
    }
    assert "KMS_KEY_ID" in message["error"] and "record" not in message
    assert whole["record"] == record
    assert item["grantId"] in stack.grant_ids()

    monkeypatch.setenv("KMS_KEY_ID", stack.key_arn)  # the cause, fixed
    code = cli.main(["redrive", "--queue-url", queue, "--wait-seconds", "0", "--json"])

    assert (code, json.loads(capsys.readouterr().out)) == (
        0,
        {
            "messages": 1,
            "deleted": 1,
            "records": {"cleaned": 1, "skipped": 0, "failed": 0, "notRemovals": 0},
            "kept": [],
        },
    )
    assert item["grantId"] not in stack.grant_ids()
    assert stack.objects(item["scratchPrefix"]) == []
    # The record's object is gone; the marker saying it was redriven stays, for a duplicate of its message.
    assert stack.objects("dead-letter/") == [stored.replace("dead-letter/", "dead-letter/redriven/", 1)]
    assert messages(queue) == []


def test_an_error_too_long_for_the_message_is_shortened_there_and_whole_in_the_object(stack: SessionStack) -> None:
    queue = new_queue(stack, MaximumMessageSize="8192")
    hostile = f"sessions/../{'a' * 20_000}/"
    stack.put_session("long", objects=0, grant=False, extra={"scratchPrefix": hostile})
    stack.delete("long")
    runtime = stack.runtime(dead_letter_queue_url=queue)

    assert invoke(runtime, stack.lambda_event()) == {"batchItemFailures": []}

    [message] = messages(queue)
    whole = json.loads(stack.s3.get_object(Bucket=stack.bucket, Key=message["recordObject"]["key"])["Body"].read())
    assert message["truncated"] is True and len(message["error"]) < 1_100
    assert hostile in whole["error"] and whole["error"].startswith(message["error"].removesuffix("..."))


def test_a_stored_record_is_not_dead_lettered_when_its_object_cannot_be_written(stack: SessionStack) -> None:
    queue = new_queue(stack, MaximumMessageSize="4096")
    stack.put_session("nowhere", objects=0, grant=False, extra={"scratchPrefix": UNSAFE, "tenantId": "x" * 5_000})
    stack.delete("nowhere")
    event = stack.lambda_event()
    [record] = removes(event)
    runtime = stack.runtime(dead_letter_queue_url=queue, dead_letter_bucket=f"{stack.bucket}-missing")

    answer = invoke(runtime, event)

    assert answer == {"batchItemFailures": [{"itemIdentifier": record["dynamodb"]["SequenceNumber"]}]}
    assert messages(queue) == []


def test_a_dry_run_redrive_keeps_the_stored_record_and_its_message(
    worker_env: SessionStack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = worker_env
    queue = new_queue(stack, MaximumMessageSize="4096")
    item, key = stored_message(stack, queue, "planned")
    monkeypatch.setenv("CLEANUP_MODE", "dry-run")

    code, summary = redrive(capsys, queue)

    assert (code, summary["deleted"], summary["wouldDelete"], summary["kept"]) == (0, 0, 1, [])
    assert key in stack.objects("dead-letter/") and len(messages(queue)) == 1
    assert item["grantId"] in stack.grant_ids()


def stored_message(stack: SessionStack, queue: str, session: str) -> tuple[dict[str, Any], str]:
    """Dead-letter one record through S3 (a 4 KiB queue); returns its item and its object's key."""
    item = stack.put_session(session, tenant="x" * 5_000, prefix=f"sessions/{session}/")
    stack.delete(session)
    runtime = stack.runtime(dead_letter_queue_url=queue, kms_key_id=None)
    assert invoke(runtime, stack.lambda_event()) == {"batchItemFailures": []}
    [key] = [k for k in stack.objects("dead-letter/") if k.endswith(".json")]
    return item, key


def test_a_duplicate_message_of_a_stored_record_is_deleted_once_the_record_is_redriven(
    worker_env: SessionStack, capsys: pytest.CaptureFixture[str]
) -> None:
    # A SendMessageBatch answer lost and the batch sent again: two messages name one stored record.
    stack = worker_env
    queue = new_queue(stack, MaximumMessageSize="4096")
    item, key = stored_message(stack, queue, "twice")
    [message] = messages(queue)
    client("sqs").send_message(QueueUrl=queue, MessageBody=json.dumps(message))

    first = redrive(capsys, queue)
    second = redrive(capsys, queue)

    assert first[0] == 0 and (first[1]["messages"], first[1]["deleted"], first[1]["duplicates"]) == (2, 2, 1)
    assert second == (
        0,
        {
            "messages": 0,
            "deleted": 0,
            "records": {"cleaned": 0, "skipped": 0, "failed": 0, "notRemovals": 0},
            "kept": [],
        },
    )
    assert messages(queue) == []
    assert key not in stack.objects("dead-letter/")
    assert item["grantId"] not in stack.grant_ids() and stack.objects(item["scratchPrefix"]) == []


def test_a_message_whose_object_was_lost_otherwise_is_reported_once_and_kept_in_s3(
    worker_env: SessionStack, capsys: pytest.CaptureFixture[str]
) -> None:
    stack = worker_env
    queue = new_queue(stack, MaximumMessageSize="4096")
    item, key = stored_message(stack, queue, "lost")
    [message] = messages(queue)
    stack.s3.delete_object(Bucket=stack.bucket, Key=key)

    first = redrive(capsys, queue)
    second = redrive(capsys, queue)

    assert first[0] == 1 and first[1]["kept"] == []
    [lost] = first[1]["reportedLost"]
    assert f"s3://{stack.bucket}/{key}" in lost["error"] and "missing" in lost["error"]
    [report] = [k for k in stack.objects("dead-letter/lost/")]
    assert report in lost["error"]
    saved = json.loads(stack.s3.get_object(Bucket=stack.bucket, Key=report)["Body"].read())
    assert saved["message"] == message
    assert second == (
        0,
        {
            "messages": 0,
            "deleted": 0,
            "records": {"cleaned": 0, "skipped": 0, "failed": 0, "notRemovals": 0},
            "kept": [],
        },
    )
    assert messages(queue) == []
    assert item["grantId"] in stack.grant_ids()


@pytest.mark.parametrize(
    "where",
    [
        {"bucket": "{bucket}", "key": "sessions/t1/victim/part-00000"},
        {"bucket": "{bucket}", "key": "dead-letter/../sessions/t1/victim/part-00000"},
        {"bucket": "{bucket}-other", "key": "{key}"},
    ],
    ids=["a scratch object", "a dot-dot key", "another bucket"],
)
def test_a_message_naming_an_object_the_worker_did_not_store_deletes_nothing(
    worker_env: SessionStack, capsys: pytest.CaptureFixture[str], where: dict[str, str]
) -> None:
    stack = worker_env
    queue = new_queue(stack, MaximumMessageSize="4096")
    stack.put_session("victim", grant=False)
    _, key = stored_message(stack, queue, "forged")
    [message] = messages(queue)
    other = f"{stack.bucket}-other"
    stack.s3.create_bucket(Bucket=other)
    stack.s3.put_object(Bucket=other, Key=key, Body=b"{}")
    forged = {**message, "recordObject": {k: v.format(bucket=stack.bucket, key=key) for k, v in where.items()}}
    forged.pop("integrity")
    sqs = client("sqs")
    sqs.purge_queue(QueueUrl=queue)
    # Tagged again, as if the key had tagged it: the location check stands behind the tag on its own.
    sqs.send_message(QueueUrl=queue, MessageBody=seal(json.dumps(forged), stack.runtime()))

    code, summary = redrive(capsys, queue)

    assert code == 1
    assert "not a dead-letter object of this worker" in summary["kept"][0]["error"]
    assert len(stack.objects("sessions/t1/victim/")) == 3
    assert stack.objects("dead-letter/") == [key]
    assert [o["Key"] for o in stack.s3.list_objects_v2(Bucket=other)["Contents"]] == [key]


def test_nothing_is_sent_once_the_deadline_has_passed_and_the_records_stay_failed(stack: SessionStack) -> None:
    queue = new_queue(stack)
    stack.put_session("late", objects=0, grant=False, extra={"scratchPrefix": UNSAFE})
    stack.delete("late")
    records = read_lambda_event(stack.lambda_event())

    outcomes = run_batch(records, stack.runtime(dead_letter_queue_url=queue), Deadline(time.monotonic() - 1))

    assert [(o.failed, o.dead_lettered) for o in outcomes if o.event_name == "REMOVE"] == [(True, False)]
    assert messages(queue) == []


@pytest.mark.parametrize("operation", ["GetQueueAttributes", "SendMessageBatch"])
def test_a_queue_failing_for_a_moment_is_tried_again_and_the_records_are_dead_lettered(
    stack: SessionStack, operation: str
) -> None:
    queue = new_queue(stack)
    stack.put_session("bad", objects=0, grant=False, extra={"scratchPrefix": UNSAFE})
    stack.delete("bad")
    runtime = stack.runtime(dead_letter_queue_url=queue, botocore_max_attempts=1, retry_max_wait_seconds=0.05)
    failed = Faults(runtime.clients.sqs, operation, "InternalError", status=500, times=2)

    assert invoke(runtime, stack.lambda_event()) == {"batchItemFailures": []}
    assert failed.sent == 3 and len(messages(queue)) == 1


def test_out_of_time_between_requests_names_every_stored_record_left_unsent(
    stack: SessionStack, caplog: pytest.LogCaptureFixture
) -> None:
    # 25 stored records: three SendMessageBatch requests. The deadline passes as the first is answered; the two
    # after it are not tried, and the ERROR line names every object they would have carried (the objects stay).
    caplog.set_level(logging.DEBUG, logger="cleanup")
    queue = new_queue(stack, MaximumMessageSize="4096")
    for n in range(25):
        stack.put_session(f"late-{n}", objects=0, grant=False, extra={"scratchPrefix": UNSAFE, "tenantId": "x" * 5_000})
        stack.delete(f"late-{n}")
    records = read_lambda_event(stack.lambda_event())
    outcomes = run_batch(records, stack.runtime(), Deadline())
    runtime = stack.runtime(dead_letter_queue_url=queue)
    deadline = Deadline()

    def run_out(**_: Any) -> None:  # the first request is answered, and nothing is left for another
        deadline.at = time.monotonic()

    runtime.clients.sqs.meta.events.register("after-call.sqs.SendMessageBatch", run_out)

    result = dead_letter(outcomes, records, runtime, deadline=deadline)

    assert [o.dead_lettered for o in result if o.failed].count(True) == 10
    assert len(messages(queue)) == 10
    [line] = [r for r in caplog.records if r.getMessage().startswith("out of time to send to the dead-letter")]
    [keys] = [r for r in caplog.records if r.getMessage() == "stored records not sent"]
    stored = [k for k in stack.objects("dead-letter/") if k.endswith(".json")]
    assert (line.levelname, line.records, line.storedObjects) == ("ERROR", 15, 15)
    assert keys.levelname == "DEBUG" and len(keys.storedObjects) == 15 and set(keys.storedObjects) <= set(stored)
    assert len(stored) == 25


def test_a_message_keeps_only_the_key_and_the_session_attributes(stack: SessionStack) -> None:
    queue = new_queue(stack)
    stack.put_session("private", objects=0, grant=False, extra={"scratchPrefix": UNSAFE, "profile": "user's own"})
    stack.delete("private")

    assert invoke(stack.runtime(dead_letter_queue_url=queue), stack.lambda_event()) == {"batchItemFailures": []}

    [message] = messages(queue)
    assert set(message["record"]["dynamodb"]["OldImage"]) == {"pk", "sk", "tenantId", "scratchPrefix", "ttl"}
    assert message["record"]["dynamodb"]["Keys"] == {"pk": {"S": "session#private"}, "sk": {"S": "meta"}}


def test_a_stored_record_overwritten_after_it_was_written_is_refused_by_redrive(
    worker_env: SessionStack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = worker_env
    queue = new_queue(stack, MaximumMessageSize="4096")
    live = stack.put_session("live")
    item, key = stored_message(stack, queue, "ended")
    whole = json.loads(stack.s3.get_object(Bucket=stack.bucket, Key=key)["Body"].read())
    image = {**whole["record"]["dynamodb"]["OldImage"], "grantId": {"S": live["grantId"]}}
    whole["record"]["dynamodb"]["OldImage"] = {**image, "scratchPrefix": {"S": live["scratchPrefix"]}}
    stack.s3.put_object(Bucket=stack.bucket, Key=key, Body=json.dumps(whole).encode())
    monkeypatch.setenv("KMS_KEY_ID", stack.key_arn)

    code, summary = redrive(capsys, queue)

    assert code == 1 and "integrity" in summary["kept"][0]["error"]
    assert live["grantId"] in stack.grant_ids() and len(stack.objects(live["scratchPrefix"])) == 3
    assert item["grantId"] in stack.grant_ids()  # its record cannot be vouched for: kept for an operator
    assert key in stack.objects("dead-letter/") and len(messages(queue)) == 1
