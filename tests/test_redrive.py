"""``cleanup-worker redrive``: re-read failed batches from the stream, clean them, delete only clean messages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from cleanup.operations.redrive import redrive as redrive_message
from cleanup.queues.deadletter import message_body
from cleanup.queues.integrity import seal
from schemas.outcomes import Outcome, Status
from schemas.records import Source, read_record
from tests.queues import on_queue, redrive, send
from tests.stack import SessionStack, client, to_av
from tests.strategies import bodies
from worker import cli
from worker import redrive as redrive_command

ON_FAILURE = json.loads((Path(__file__).parent / "events" / "lambda-on-failure-destination.json").read_text())


@pytest.fixture
def queue(stack: SessionStack) -> str:
    return str(client("sqs").create_queue(QueueName=f"failures-{stack.table}")["QueueUrl"])


def on_failure(stack: SessionStack, records: list[dict[str, Any]], **changes: Any) -> str:
    """The on-failure destination message Lambda would send for ``records`` (the documented sample, retargeted)."""
    numbers = [r["dynamodb"]["SequenceNumber"] for r in records]
    shard = stack.streams.describe_stream(StreamArn=stack.stream_arn)["StreamDescription"]["Shards"][0]["ShardId"]
    info = {
        **ON_FAILURE["DDBStreamBatchInfo"],
        "streamArn": stack.stream_arn,
        "shardId": shard,
        "startSequenceNumber": numbers[0],
        "endSequenceNumber": numbers[-1],
        "batchSize": len(records),
        **changes,
    }
    return json.dumps({**ON_FAILURE, "DDBStreamBatchInfo": info})


def test_a_failed_batch_is_read_again_cleaned_and_its_message_deleted(worker_env, queue, capsys):
    stack = worker_env
    first, second = stack.put_session("r1", connection_id="conn-r1"), stack.put_session("r2")
    stack.delete("r1")
    stack.expire("r2")
    send(queue, on_failure(stack, stack.new_records()))

    code, summary = redrive(capsys, queue)

    assert (code, summary) == (
        0,
        {
            "messages": 1,
            "deleted": 1,
            "records": {"cleaned": 2, "skipped": 0, "failed": 0, "notRemovals": 2},
            "kept": [],
        },
    )
    assert stack.objects(first["scratchPrefix"]) == stack.objects(second["scratchPrefix"]) == []
    assert {first["grantId"], second["grantId"]}.isdisjoint(stack.grant_ids())
    assert on_queue(queue) == []


def test_a_dry_run_plans_every_record_and_deletes_no_message(worker_env, queue, capsys, monkeypatch):
    # The rollout starts in dry run: a redrive then must not take away the message, the only pointer to its records.
    stack = worker_env
    ended = stack.put_session("r1")
    stack.delete("r1")
    message = on_failure(stack, stack.new_records())
    send(queue, message)
    monkeypatch.setenv("CLEANUP_MODE", "dry-run")

    code, summary = redrive(capsys, queue)

    assert (code, summary) == (
        0,
        {
            "messages": 1,
            "deleted": 0,
            "records": {"cleaned": 1, "skipped": 0, "failed": 0, "notRemovals": 1},
            "kept": [],
            "dryRun": True,
            "wouldDelete": 1,
        },
    )
    assert on_queue(queue) == [message]
    assert len(stack.objects(ended["scratchPrefix"])) == 3 and ended["grantId"] in stack.grant_ids()

    monkeypatch.setenv("CLEANUP_MODE", "enforce")
    assert redrive(capsys, queue) == (
        0,
        {
            "messages": 1,
            "deleted": 1,
            "records": {"cleaned": 1, "skipped": 0, "failed": 0, "notRemovals": 1},
            "kept": [],
        },
    )
    assert stack.objects(ended["scratchPrefix"]) == [] and on_queue(queue) == []


def test_only_the_named_range_is_cleaned(worker_env, queue, capsys):
    stack = worker_env
    inside, after = stack.put_session("in"), stack.put_session("after")
    stack.delete("in")
    batch = stack.new_records()
    stack.delete("after")
    send(queue, on_failure(stack, batch))

    code, _ = redrive(capsys, queue)

    assert code == 0
    assert stack.objects(inside["scratchPrefix"]) == []
    assert len(stack.objects(after["scratchPrefix"])) == 3


def test_a_message_with_a_failed_record_is_kept(worker_env, queue, capsys):
    stack = worker_env
    stack.s3.put_object(Bucket=stack.bucket, Key="shared/keep", Body=b"x")
    stack.put_session("bad", grant=False, objects=0, extra={"scratchPrefix": "shared/"})
    stack.delete("bad")
    records = stack.new_records()
    body = on_failure(stack, records)
    send(queue, body)

    code, summary = redrive(capsys, queue)

    assert code == 1
    (kept,) = summary["kept"]
    assert [f["sequenceNumber"] for f in kept["failed"]] == [records[-1]["dynamodb"]["SequenceNumber"]]
    assert on_queue(queue) == [body]  # kept, and visible again at once
    assert stack.objects("shared/") == ["shared/keep"]


def test_records_trimmed_from_the_stream_are_reported_lost_and_the_message_kept(worker_env, queue, capsys):
    stack = worker_env
    item = stack.put_session("t1")
    stack.delete("t1")
    records = stack.new_records()
    before_the_shard = str(int(records[0]["dynamodb"]["SequenceNumber"]) - 5)
    body = on_failure(stack, records, startSequenceNumber=before_the_shard, batchSize=len(records) + 5)
    send(queue, body)

    code, summary = redrive(capsys, queue)

    assert code == 1
    (kept,) = summary["kept"]
    first_kept = str(int(records[0]["dynamodb"]["SequenceNumber"]) - 1)
    assert kept["lost"] == [{"first": before_the_shard, "last": first_kept, "why": "no longer in the stream (trimmed)"}]
    assert kept["missing"] == 5
    assert stack.objects(item["scratchPrefix"]) == []  # what is still in the stream is cleaned all the same
    assert on_queue(queue) == [body]


def test_a_batch_of_a_deleted_stream_is_lost_whole(worker_env, queue, capsys, monkeypatch):
    stack = worker_env
    monkeypatch.setenv("SESSION_TABLE", f"{stack.table}-deleted")  # the session table, deleted with its stream
    gone_arn = stack.stream_arn.replace(stack.table, f"{stack.table}-deleted")
    body = on_failure(stack, [{"dynamodb": {"SequenceNumber": "100"}}, {"dynamodb": {"SequenceNumber": "300"}}])
    body = body.replace(stack.stream_arn, gone_arn)
    send(queue, body)

    code, summary = redrive(capsys, queue)

    assert code == 1
    assert summary["kept"][0]["lost"] == [
        {"first": "100", "last": "300", "why": "the stream or its shard no longer exists"}
    ]
    assert on_queue(queue) == [body]


def test_a_dead_letter_message_is_cleaned_from_the_record_it_carries(worker_env, queue, capsys):
    stack = worker_env
    item = stack.put_session("dl", connection_id="conn-dl")
    stack.delete("dl")
    raw = stack.lambda_event()["Records"][-1]
    record = read_record(raw, Source.LAMBDA)
    failed = Outcome(sequence_number=record.sequence_number, status=Status.FAILED, error="AccessDenied")
    send(queue, seal(message_body(failed, record), stack.runtime()))

    code, summary = redrive(capsys, queue)

    assert (code, summary["deleted"]) == (0, 1)
    assert stack.objects(item["scratchPrefix"]) == []
    assert item["grantId"] not in stack.grant_ids()
    assert on_queue(queue) == []


def test_an_unknown_message_is_reported_and_kept(worker_env, queue, capsys):
    send(queue, '{"hello": "world"}')

    code, summary = redrive(capsys, queue)

    assert code == 1
    assert summary["kept"][0]["kind"] == "unknown"
    assert "neither a Lambda on-failure message" in summary["kept"][0]["error"]
    assert on_queue(queue) == ['{"hello": "world"}']


def test_the_readable_report_says_what_was_deleted_and_kept(worker_env, queue, capsys):
    stack = worker_env
    stack.put_session("ok")
    stack.delete("ok")
    send(queue, on_failure(stack, stack.new_records()), "not json")

    code = cli.main(["redrive", "--queue-url", queue, "--wait-seconds", "0"])

    out = capsys.readouterr().out
    assert code == 1
    assert "on-failure   2 records: 1 cleaned, 0 skipped, 0 failed, 1 not removals  deleted" in out
    assert "2 messages: 1 deleted, 1 kept; records: 1 cleaned, 0 skipped, 0 failed" in out


def test_each_message_is_reported_as_soon_as_it_is_redriven(worker_env, queue, capsys, monkeypatch):
    stack = worker_env
    stack.put_session("r1")
    stack.delete("r1")
    first = stack.new_records()
    stack.put_session("r2")
    stack.delete("r2")
    second = stack.new_records()
    send(queue, on_failure(stack, first), on_failure(stack, second))
    printed_before: list[str] = []
    real = redrive_command.redrive

    def watched(body: str, runtime: Any) -> Any:
        printed_before.append(capsys.readouterr().out)  # what the command had printed when this message started
        return real(body, runtime)

    monkeypatch.setattr(redrive_command, "redrive", watched)

    code = cli.main(["redrive", "--queue-url", queue, "--wait-seconds", "0"])

    assert code == 0
    assert printed_before[0] == ""
    assert (
        "2 records: 1 cleaned, 0 skipped, 0 failed, 1 not removals  deleted" in printed_before[1]
    )  # the first message, before the second one ran


def forged_removal(stack: SessionStack, live: dict[str, Any]) -> str:
    """A hand-made dead-letter message: SESSION_TABLE's stream, a key no item has, ``live``'s resources."""
    [insert] = [r for r in stack.lambda_event()["Records"] if r["eventName"] == "INSERT"]
    image = to_av({**live, "pk": "session#ghost", "sk": "meta"})
    dynamodb = {**insert["dynamodb"], "Keys": {"pk": image["pk"], "sk": image["sk"]}, "OldImage": image}
    dynamodb.pop("NewImage")
    record = read_record({**insert, "eventName": "REMOVE", "dynamodb": dynamodb}, Source.LAMBDA)
    return message_body(Outcome(sequence_number=record.sequence_number, status=Status.FAILED, error="x"), record)


def test_a_hand_made_dead_letter_message_naming_a_live_session_frees_nothing(worker_env, queue, capsys):
    stack = worker_env
    live = stack.put_session("live", connection_id="conn-live")
    body = forged_removal(stack, live)
    send(queue, body)

    code, summary = redrive(capsys, queue)

    assert live["grantId"] in stack.grant_ids() and len(stack.objects(live["scratchPrefix"])) == 3
    assert code == 1 and "integrity" in summary["kept"][0]["error"]
    assert on_queue(queue) == [body]  # kept for an operator, never deleted silently


@pytest.mark.slow
def test_any_unreadable_message_is_reported_alone_and_never_raises(stack: SessionStack) -> None:
    ended = stack.put_session("ended")
    stack.delete("ended")
    raw = stack.lambda_event()["Records"][-1]
    record = read_record(raw, Source.LAMBDA)
    good = message_body(Outcome(sequence_number=record.sequence_number, status=Status.FAILED, error="x"), record)
    batch_info = on_failure(stack, [raw], batchSize=[1])
    runtime = stack.runtime()

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(bodies(good) | bodies(batch_info))
    def one_bad(bad: str) -> None:
        assert not redrive_message(bad, runtime).settled

    one_bad()
    assert ended["grantId"] in stack.grant_ids()
