"""Replay, redrive and Lambda trust only SESSION_TABLE: a record or message naming another table frees nothing.

Each attack reuses a live session: it is deleted and put back with the same key and resources (a reconnect), and its
REMOVE record is then re-labelled as another table's. The race check used to read the table the record names, find
nothing there, and free the live session's socket, grant and scratch objects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cleanup.operations.redrive import redrive as redrive_message
from cleanup.queues.deadletter import message_body
from cleanup.queues.integrity import seal
from schemas.outcomes import Outcome, Status
from schemas.records import Source, read_record
from tests.queues import on_queue, redrive, send
from tests.stack import SessionStack, client
from worker import cli, lambda_handler
from worker.local.backend import create_session_table
from worker.local.gateway import LocalGateway

ON_FAILURE = json.loads((Path(__file__).parent / "events" / "lambda-on-failure-destination.json").read_text())


@pytest.fixture
def queue(stack: SessionStack) -> str:
    return str(client("sqs").create_queue(QueueName=f"foreign-{stack.table}")["QueueUrl"])


@pytest.fixture
def other(stack: SessionStack) -> str:
    """Another table of the account, with the same key schema and a stream: its ARN is the stream's."""
    return str(create_session_table(stack.ddb, f"other-{stack.table}"))


def reconnected(stack: SessionStack, gateway: LocalGateway) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    """A session deleted and put back with the same key and resources: (its live item, its socket, the REMOVE)."""
    socket = gateway.connect()
    item = stack.put_session("s1", connection_id=socket.connection_id)
    stack.delete("s1")
    stack.put_item(item)
    remove = next(r for r in stack.new_records() if r["eventName"] == "REMOVE")
    return item, socket, remove


def relabelled(remove: dict[str, Any], stream_arn: str) -> dict[str, Any]:
    return {**remove, "eventSourceARN": stream_arn}


def assert_untouched(stack: SessionStack, gateway: LocalGateway, item: dict[str, Any], socket: Any) -> None:
    assert len(stack.objects(item["scratchPrefix"])) == 3
    assert item["grantId"] in stack.grant_ids()
    assert gateway.is_open(socket.connection_id) and not socket.closed


def test_a_replayed_record_of_another_table_is_skipped_and_frees_nothing(
    worker_env, gateway, other, capsys, monkeypatch, tmp_path
):
    stack = worker_env
    monkeypatch.setenv("WS_CALLBACK_URL", gateway.callback_url)
    item, socket, remove = reconnected(stack, gateway)
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(relabelled(remove, other)) + "\n")

    code = cli.main(["replay", "--json", str(path)])

    captured = capsys.readouterr()
    assert (code, json.loads(captured.out)) == (
        2,  # every record is another table's: nothing could ever be cleaned, which is said
        {"records": 1, "cleaned": 0, "planned": 0, "skipped": 1, "failed": []},
    )
    assert f"every record is an item of 'other-{stack.table}', none of SESSION_TABLE" in captured.err
    assert_untouched(stack, gateway, item, socket)
    socket.close()


def test_a_dead_letter_message_of_another_table_is_skipped_and_frees_nothing(stack, gateway, other):
    item, socket, remove = reconnected(stack, gateway)
    record = read_record(relabelled(remove, other), Source.LAMBDA)
    body = message_body(Outcome(sequence_number=record.sequence_number, status=Status.FAILED, error="x"), record)
    body = seal(body, stack.runtime())  # as the worker writes it: the tag verifies, and the table still decides

    result = redrive_message(body, stack.runtime(ws_callback_url=gateway.callback_url))

    assert [outcome.status for outcome in result.outcomes] == [Status.SKIPPED]
    assert "other-" in (result.outcomes[0].skip_reason or "") and "SESSION_TABLE" in result.outcomes[0].skip_reason
    assert_untouched(stack, gateway, item, socket)
    socket.close()


def test_a_lambda_record_of_another_table_is_skipped_and_frees_nothing(stack, gateway, other):
    item, socket, remove = reconnected(stack, gateway)

    with lambda_handler.warm.use(stack.runtime(ws_callback_url=gateway.callback_url)):
        answer = lambda_handler.handler({"Records": [relabelled(remove, other)]}, None)

    assert answer == {"batchItemFailures": []}
    assert_untouched(stack, gateway, item, socket)
    socket.close()


def test_in_lambda_without_session_table_the_mappings_table_is_the_session_table(stack):
    item = stack.put_session("gone")
    stack.delete("gone")

    with lambda_handler.warm.use(stack.runtime(session_table=None)):
        answer = lambda_handler.handler(stack.lambda_event(), None)

    assert answer == {"batchItemFailures": []}
    assert stack.objects(item["scratchPrefix"]) == [] and item["grantId"] not in stack.grant_ids()


def on_failure_of(stack: SessionStack, stream_arn: str) -> str:
    """The on-failure destination message Lambda would send for every record now in ``stream_arn``."""
    shard = stack.streams.describe_stream(StreamArn=stream_arn)["StreamDescription"]["Shards"][0]["ShardId"]
    iterator = stack.streams.get_shard_iterator(StreamArn=stream_arn, ShardId=shard, ShardIteratorType="TRIM_HORIZON")
    records = stack.streams.get_records(ShardIterator=iterator["ShardIterator"])["Records"]
    numbers = [record["dynamodb"]["SequenceNumber"] for record in records]
    info = {
        **ON_FAILURE["DDBStreamBatchInfo"],
        "streamArn": stream_arn,
        "shardId": shard,
        "startSequenceNumber": numbers[0],
        "endSequenceNumber": numbers[-1],
        "batchSize": len(numbers),
    }
    return json.dumps({**ON_FAILURE, "DDBStreamBatchInfo": info})


def test_an_on_failure_message_of_another_tables_stream_is_refused_and_kept(worker_env, other, queue, capsys):
    stack = worker_env
    table = other.split(":table/", 1)[1].split("/", 1)[0]
    prefix = "sessions/t1/elsewhere/"
    stack.put_objects([f"{prefix}part-0", f"{prefix}part-1"])
    key = {"pk": {"S": "session#elsewhere"}, "sk": {"S": "meta"}}
    stack.ddb.put_item(TableName=table, Item={**key, "tenantId": {"S": "t1"}, "scratchPrefix": {"S": prefix}})
    stack.ddb.delete_item(TableName=table, Key=key)
    body = on_failure_of(stack, other)
    send(queue, body)

    code, summary = redrive(capsys, queue)

    assert code == 1
    assert summary["deleted"] == 0 and len(summary["kept"]) == 1
    assert "not SESSION_TABLE" in summary["kept"][0]["error"] and other in summary["kept"][0]["error"]
    assert summary["kept"][0]["failed"] == []  # nothing was read from that stream
    assert on_queue(queue) == [body]
    assert stack.objects(prefix) == [f"{prefix}part-0", f"{prefix}part-1"]


@pytest.mark.parametrize("command", ["replay", "redrive"])
def test_replay_and_redrive_refuse_to_start_without_session_table(command, worker_env, queue, capsys, monkeypatch):
    monkeypatch.delenv("SESSION_TABLE")
    argv = {"replay": ["replay", "nothing.json"], "redrive": ["redrive", "--queue-url", queue, "--wait-seconds", "0"]}

    code = cli.main(argv[command])

    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.count("\n") == 1 and f"cleanup-worker {command}: " in captured.err
    assert "SESSION_TABLE" in captured.err
    assert captured.out == ""
