"""The Lambda handler on a Kinesis data stream the session table streams to (Kinesis Data Streams for DynamoDB).

The events are built from the stack's real stream records, put in the Kinesis format (``tests.kcl_daemon``) and in
the ``aws:kinesis`` event shape Lambda delivers.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import boto3
import pytest

from cleanup.queues.reporting import run_batch
from schemas.outcomes import Reason, Status
from schemas.records import RecordError, Source, parse_record, read_lambda_event
from tests.kcl_daemon import KinesisShard, kinesis_payload, lambda_kinesis_event
from tests.stack import SessionStack
from worker import cli, lambda_handler
from worker.local.backend import create_registry_table, join_room, membership
from worker.local.gateway import LocalGateway

STREAM_ARN = "arn:aws:kinesis:us-east-1:123456789012:stream/session-changes"


def kinesis_event(stack: SessionStack, *extra: Any) -> dict[str, Any]:
    """The stack's new stream records (and ``extra`` raw payloads after them) as a Lambda Kinesis event."""
    payloads: list[Any] = [kinesis_payload(record, stack.table) for record in stack.new_records()]
    return lambda_kinesis_event(KinesisShard().records([*payloads, *extra]), STREAM_ARN)


def invoke(stack: SessionStack, event: dict[str, Any], **settings: Any) -> dict[str, Any]:
    with lambda_handler.warm.use(stack.runtime(ws_callback_url=stack.aws.endpoint_url, **settings)):
        return lambda_handler.handler(event, None)


def sequence_numbers(event: dict[str, Any]) -> list[str]:
    return [record["kinesis"]["sequenceNumber"] for record in event["Records"]]


def test_a_kinesis_event_is_cleaned_and_its_failures_named_by_kinesis_sequence_number(stack: SessionStack) -> None:
    ended = stack.put_session("k1", connection_id="conn-k1")
    live = stack.put_session("k-live")
    stack.s3.put_object(Bucket=stack.bucket, Key="elsewhere/k2/keep", Body=b"keep")
    refused = stack.put_session("k2", extra={"scratchPrefix": "elsewhere/k2/"})
    stack.delete("k1")
    stack.delete("k2")
    event = kinesis_event(stack)

    answer = invoke(stack, event)

    assert answer == {"batchItemFailures": [{"itemIdentifier": sequence_numbers(event)[-1]}]}
    assert stack.objects(ended["scratchPrefix"]) == []
    assert ended["grantId"] not in stack.grant_ids()
    assert refused["grantId"] not in stack.grant_ids()  # its other actions still ran
    assert stack.objects("elsewhere/") == ["elsewhere/k2/keep"]
    assert len(stack.objects(live["scratchPrefix"])) == 3 and live["grantId"] in stack.grant_ids()


@pytest.mark.parametrize(
    "data",
    [
        "%%% not base64 %%%",
        base64.b64encode(b"{not json").decode(),
        base64.b64encode(b"[1, 2]").decode(),
        base64.b64encode(b"[" * 200_000 + b"]" * 200_000).decode(),  # deeper than Python's JSON parser recurses
    ],
)
def test_data_that_cannot_be_decoded_is_reported_by_its_sequence_number(stack: SessionStack, data: str) -> None:
    item = stack.put_session("fine")
    stack.delete("fine")
    event = kinesis_event(stack, b"placeholder")
    event["Records"][-1]["kinesis"]["data"] = data

    answer = invoke(stack, event)

    assert answer == {"batchItemFailures": [{"itemIdentifier": sequence_numbers(event)[-1]}]}
    assert stack.objects(item["scratchPrefix"]) == []  # the rest of the batch is cleaned


def test_undecodable_data_goes_to_the_dead_letter_queue_with_its_sequence_number(stack: SessionStack) -> None:
    sqs = boto3.client("sqs", region_name="us-east-1")
    queue = sqs.create_queue(QueueName=f"dlq-kinesis-{stack.table}")["QueueUrl"]
    event = kinesis_event(stack, b"\xff\xfe not utf-8")

    answer = invoke(stack, event, dead_letter_queue_url=queue)

    [message] = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)["Messages"]
    body = json.loads(message["Body"])
    assert answer == {"batchItemFailures": []}
    assert body["sequenceNumber"] == sequence_numbers(event)[-1]
    assert "not base64 JSON" in body["error"]


def test_a_kinesis_record_without_a_sequence_number_fails_the_invocation(stack: SessionStack) -> None:
    stack.put_session("x")
    stack.delete("x")
    event = kinesis_event(stack)
    del event["Records"][-1]["kinesis"]["sequenceNumber"]

    with pytest.raises(RecordError, match="sequence number"):
        invoke(stack, event)


@pytest.mark.parametrize("unit", [1_000, 1_000_000], ids=["milliseconds", "microseconds"])
def test_creation_times_in_milliseconds_or_microseconds_give_the_same_reason(stack: SessionStack, unit: int) -> None:
    """DynamoDB streams to Kinesis with either precision (ApproximateCreationDateTimePrecision)."""
    stack.put_session("logout")
    stack.put_session("swept", ttl=int(time.time()) - 60)
    stack.delete("logout")
    stack.delete("swept")
    payloads = [kinesis_payload(record, stack.table) for record in stack.new_records()]
    for payload in payloads:
        seconds = payload["dynamodb"]["ApproximateCreationDateTime"] / 1000
        payload["dynamodb"]["ApproximateCreationDateTime"] = int(seconds * unit)
    records = read_lambda_event(lambda_kinesis_event(KinesisShard().records(payloads), STREAM_ARN))

    outcomes = [o for o in run_batch(records, stack.runtime()) if o.event_name == "REMOVE"]

    assert [(o.status, o.reason) for o in outcomes] == [
        (Status.CLEANED, Reason.EXPLICIT),
        (Status.CLEANED, Reason.EXPIRED),
    ]


@pytest.mark.parametrize("created", [1_700_000_000_123, 1_700_000_000_123_456], ids=["milliseconds", "microseconds"])
def test_a_kinesis_creation_time_is_read_in_seconds_whatever_its_precision(created: int) -> None:
    payload = {"eventName": "REMOVE", "tableName": "t", "dynamodb": {"ApproximateCreationDateTime": created}}

    record = parse_record(payload, Source.KINESIS, sequence_number="1")

    assert record.created_at == pytest.approx(1_700_000_000.123, abs=0.001)


def test_replay_reads_a_saved_kinesis_event(worker_env: SessionStack, tmp_path: Path, capsys) -> None:
    stack = worker_env
    item = stack.put_session("saved")
    stack.delete("saved")
    saved = tmp_path / "kinesis-event.json"
    saved.write_text(json.dumps(kinesis_event(stack), indent=2))

    code = cli.main(["replay", "--json", str(saved)])

    assert code == 0
    assert json.loads(capsys.readouterr().out) == {"records": 2, "cleaned": 1, "planned": 0, "skipped": 1, "failed": []}
    assert stack.objects(item["scratchPrefix"]) == []


def removed(table: str, item: dict[str, Any]) -> dict[str, Any]:
    """A REMOVE of ``item`` from ``table`` in the Kinesis format (as a table sharing the stream would send it)."""
    change = {"ApproximateCreationDateTime": int(time.time() * 1000), "Keys": {k: item[k] for k in ("pk", "sk")}}
    return {
        "awsRegion": "us-east-1",
        "eventID": f"e-{item['sk']['S']}",
        "eventName": "REMOVE",
        "eventSource": "aws:dynamodb",
        "tableName": table,
        "recordFormat": "application/json",
        "dynamodb": {**change, "OldImage": item, "SizeBytes": 200},
    }


def shared_stream_event(*payloads: dict[str, Any]) -> dict[str, Any]:
    return lambda_kinesis_event(KinesisShard().records(payloads), STREAM_ARN)


def test_leaving_one_room_on_a_shared_kinesis_stream_keeps_the_socket_and_the_other_rooms(
    stack: SessionStack, gateway: LocalGateway
) -> None:
    # The registry streams to the same Kinesis stream as the session table; a user leaves room r1.
    client = gateway.connect()
    registry = f"registry-{stack.table}"
    create_registry_table(stack.ddb, registry)
    left = membership("r1", client.connection_id, user_id="u1", shard=0)
    join_room(stack.ddb, registry, "r2", client.connection_id, user_id="u1", shard=1)
    event = shared_stream_event(removed(registry, left))

    with lambda_handler.warm.use(stack.runtime(ws_callback_url=gateway.callback_url, registry_table=registry)):
        answer = lambda_handler.handler(event, None)

    assert answer == {"batchItemFailures": []}
    assert not client.wait_closed(0.5) and gateway.is_open(client.connection_id)
    assert stack.ddb.scan(TableName=registry, ConsistentRead=True)["Count"] == 1  # room r2 kept


def test_another_tables_item_naming_a_live_sessions_resources_is_not_a_session(stack: SessionStack) -> None:
    live = stack.put_session("live")
    other = f"other-{stack.table}"
    stack.ddb.create_table(
        TableName=other,
        AttributeDefinitions=[{"AttributeName": n, "AttributeType": "S"} for n in ("pk", "sk")],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        BillingMode="PAY_PER_REQUEST",
    )
    lookalike = stack.ddb.get_item(TableName=stack.table, Key=stack.key("live"))["Item"]
    event = shared_stream_event(removed(other, lookalike))

    answer = invoke(stack, event)

    assert answer == {"batchItemFailures": []}
    assert len(stack.objects(live["scratchPrefix"])) == 3 and live["grantId"] in stack.grant_ids()


def test_without_session_table_a_kinesis_record_fails_by_its_sequence_number_and_frees_nothing(
    stack: SessionStack,
) -> None:
    ended = stack.put_session("k1")
    stack.delete("k1")
    event = kinesis_event(stack)
    removes = [n for n, r in zip(sequence_numbers(event), event["Records"], strict=True) if b"REMOVE" in data(r)]

    answer = invoke(stack, event, session_table=None)

    assert answer == {"batchItemFailures": [{"itemIdentifier": number} for number in removes]}
    assert len(stack.objects(ended["scratchPrefix"])) == 3 and ended["grantId"] in stack.grant_ids()


def data(record: dict[str, Any]) -> bytes:
    return base64.b64decode(record["kinesis"]["data"])
