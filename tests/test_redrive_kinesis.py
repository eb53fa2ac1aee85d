"""``cleanup-worker redrive`` of a Kinesis mapping's on-failure messages: the range is read again from the Kinesis
data stream (moto's), each record's data decoded as the DynamoDB change it carries, and cleaned by the same core."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cleanup.operations.redrive import parse_message
from cleanup.queues.deadletter import MESSAGE_FORMAT
from tests.kcl_daemon import kinesis_payload
from tests.queues import on_queue, redrive, send
from tests.stack import SessionStack, client

ON_FAILURE = json.loads((Path(__file__).parent / "events" / "lambda-on-failure-destination-kinesis.json").read_text())


@pytest.fixture
def queue(stack: SessionStack) -> str:
    return str(client("sqs").create_queue(QueueName=f"kinesis-failures-{stack.table}")["QueueUrl"])


@pytest.fixture
def stream(stack: SessionStack) -> str:
    """A Kinesis data stream of one shard, as the session table would stream to (moto cannot stream it itself)."""
    kinesis = client("kinesis")
    name = f"changes-{stack.table}"
    kinesis.create_stream(StreamName=name, ShardCount=1)
    return str(kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]["StreamARN"])


def publish(stack: SessionStack, stream: str) -> list[dict[str, str]]:
    """The stack's new stream records, put into the Kinesis stream in the Kinesis Data Streams for DynamoDB format."""
    kinesis = client("kinesis")
    published = []
    for record in stack.new_records():
        payload = kinesis_payload(record, stack.table)
        data = json.dumps(payload).encode()
        published.append(
            kinesis.put_record(StreamARN=stream, Data=data, PartitionKey=payload["dynamodb"]["Keys"]["pk"]["S"])
        )
    return published


def on_failure(stream: str, published: list[dict[str, str]], **changes: Any) -> str:
    """The on-failure message Lambda sends for a Kinesis batch (the documented sample, retargeted)."""
    info = {
        **ON_FAILURE["KinesisBatchInfo"],
        "streamArn": stream,
        "shardId": published[0]["ShardId"],
        "startSequenceNumber": published[0]["SequenceNumber"],
        "endSequenceNumber": published[-1]["SequenceNumber"],
        "batchSize": len(published),
        **changes,
    }
    return json.dumps({**ON_FAILURE, "KinesisBatchInfo": info})


def test_a_failed_kinesis_batch_is_read_again_from_the_stream_cleaned_and_its_message_deleted(
    worker_env: SessionStack, stream: str, queue: str, capsys: pytest.CaptureFixture[str]
) -> None:
    stack = worker_env
    first, second = stack.put_session("kr1", connection_id="conn-kr1"), stack.put_session("kr2")
    stack.delete("kr1")
    stack.expire("kr2")
    send(queue, on_failure(stream, publish(stack, stream)))

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


def test_only_the_named_range_of_the_kinesis_stream_is_cleaned(
    worker_env: SessionStack, stream: str, queue: str, capsys: pytest.CaptureFixture[str]
) -> None:
    stack = worker_env
    before, inside, after = stack.put_session("b"), stack.put_session("in"), stack.put_session("after")
    stack.delete("b")
    publish(stack, stream)
    stack.delete("in")
    batch = publish(stack, stream)
    stack.delete("after")
    publish(stack, stream)
    send(queue, on_failure(stream, batch))

    code, _ = redrive(capsys, queue)

    assert code == 0
    assert stack.objects(inside["scratchPrefix"]) == []
    assert len(stack.objects(before["scratchPrefix"])) == 3
    assert len(stack.objects(after["scratchPrefix"])) == 3


def test_a_failed_record_of_a_kinesis_batch_keeps_the_message(
    worker_env: SessionStack, stream: str, queue: str, capsys: pytest.CaptureFixture[str]
) -> None:
    stack = worker_env
    stack.s3.put_object(Bucket=stack.bucket, Key="shared/keep", Body=b"x")
    stack.put_session("bad", grant=False, objects=0, extra={"scratchPrefix": "shared/"})
    stack.delete("bad")
    published = publish(stack, stream)
    body = on_failure(stream, published)
    send(queue, body)

    code, summary = redrive(capsys, queue)

    (kept,) = summary["kept"]
    assert code == 1
    assert [f["sequenceNumber"] for f in kept["failed"]] == [published[-1]["SequenceNumber"]]
    assert on_queue(queue) == [body]
    assert stack.objects("shared/") == ["shared/keep"]


def test_records_missing_from_the_kinesis_stream_are_reported_lost_and_the_message_kept(
    worker_env: SessionStack, stream: str, queue: str, capsys: pytest.CaptureFixture[str]
) -> None:
    stack = worker_env
    item = stack.put_session("gone")
    stack.delete("gone")
    published = publish(stack, stream)
    beyond = str(int(published[-1]["SequenceNumber"]) + 5)
    body = on_failure(stream, published, endSequenceNumber=beyond, batchSize=len(published) + 1)
    send(queue, body)

    code, summary = redrive(capsys, queue)

    (kept,) = summary["kept"]
    assert code == 1
    assert kept["lost"] == [
        {"first": str(int(published[-1]["SequenceNumber"]) + 1), "last": beyond, "why": "not found in the stream"}
    ]
    assert stack.objects(item["scratchPrefix"]) == []  # what the stream still holds is cleaned all the same
    assert on_queue(queue) == [body]


def test_a_batch_of_a_deleted_kinesis_stream_is_lost_whole(
    worker_env: SessionStack, queue: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = "arn:aws:kinesis:us-east-1:123456789012:stream/deleted-long-ago"
    body = on_failure(gone, [{"ShardId": "shardId-000000000000", "SequenceNumber": "100"}], endSequenceNumber="300")
    send(queue, body)

    code, summary = redrive(capsys, queue)

    assert code == 1
    assert summary["kept"][0]["lost"] == [
        {"first": "100", "last": "300", "why": "the stream or its shard no longer exists"}
    ]
    assert on_queue(queue) == [body]


@pytest.mark.parametrize(("sub", "expected"), [(None, "4965"), (0, "4965"), (2, "4965/2")])
def test_a_kcl_dead_letter_is_redriven_under_its_sequence_and_sub_sequence_numbers(
    sub: int | None, expected: str
) -> None:
    payload = {"tableName": "t", "eventName": "REMOVE", "dynamodb": {"Keys": {"pk": {"S": "session#a"}}}}
    message = {"format": MESSAGE_FORMAT, "sequenceNumber": "4965", "source": "kinesis", "record": payload}
    if sub is not None:
        message["subSequenceNumber"] = sub

    record = parse_message(json.dumps(message))

    assert getattr(record, "sequence_number", None) == expected
