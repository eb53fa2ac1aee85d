"""``cleanup-worker capture``: the stream's records, exactly as GetRecords sent them, one per line."""

from __future__ import annotations

import json
import threading

import pytest

from cleanup.streams.reader import raw_get_records
from tests.stack import SessionStack
from worker import cli
from worker.capture import Capture
from worker.local.backend import create_session_table


def stream_records(stack: SessionStack) -> list[dict]:
    """Every record of the stream, read straight from GetRecords (the reference the capture must equal)."""
    shard = stack.streams.describe_stream(StreamArn=stack.stream_arn)["StreamDescription"]["Shards"][0]
    iterator = stack.streams.get_shard_iterator(
        StreamArn=stack.stream_arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    return raw_get_records(stack.streams, iterator)["Records"]


def as_captured(stack: SessionStack) -> list[dict]:
    """The stream's records as the capture writes them: unchanged, and naming their stream as Lambda's do."""
    return [{**record, "eventSourceARN": stack.stream_arn} for record in stream_records(stack)]


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_capture_by_table_name_writes_every_record_losslessly(worker_env, capsys, tmp_path):
    stack = worker_env
    stack.put_session("c1", connection_id="conn-c1")
    stack.put_item({"pk": "blob#1", "sk": "meta", "payload": b"\x00\xffbinary"})
    stack.delete("c1")
    out = tmp_path / "capture.jsonl"

    code = cli.main(["capture", "--table-name", stack.table, "--out", str(out)])

    assert code == 0
    assert lines(out) == as_captured(stack)
    assert lines(out)[1]["dynamodb"]["NewImage"]["payload"] == {"B": "AP9iaW5hcnk="}  # wire base64, not bytes
    assert isinstance(lines(out)[0]["dynamodb"]["ApproximateCreationDateTime"], float)  # epoch seconds
    assert f"captured 3 records from 1 shard of {stack.stream_arn} into {out}" in capsys.readouterr().out


def test_capture_by_stream_arn_from_latest_writes_only_later_records(worker_env, tmp_path):
    stack = worker_env
    stack.put_session("old")
    out = tmp_path / "capture.jsonl"

    code = cli.main(["capture", "--stream-arn", stack.stream_arn, "--from", "latest", "--out", str(out)])

    assert code == 0
    assert out.read_text() == ""


def test_a_table_without_a_stream_is_a_usage_error(worker_env, capsys, tmp_path):
    stack = worker_env
    stack.ddb.create_table(
        TableName=f"{stack.table}-plain",
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )

    code = cli.main(["capture", "--table-name", f"{stack.table}-plain", "--out", str(tmp_path / "x.jsonl")])

    assert code == 2
    assert "has no stream enabled" in capsys.readouterr().err


def test_the_command_needs_a_table_or_a_stream(worker_env, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["capture", "--out", str(tmp_path / "x.jsonl")])

    assert exit_.value.code == 2


def test_following_keeps_writing_new_records_until_stopped(worker_env):
    stack = worker_env
    stack.put_session("f1")
    written: list[dict] = []
    first, second, stop = threading.Event(), threading.Event(), threading.Event()

    def sink(records: list[dict]) -> None:
        written.extend(records)
        (second if len(written) >= 2 else first).set()

    capture = Capture(stack.streams, stack.stream_arn, "TRIM_HORIZON", sink)
    follower = threading.Thread(target=capture.run, kwargs={"follow": True, "stop": stop, "poll_seconds": 0.05})
    follower.start()
    try:
        assert first.wait(30)
        stack.delete("f1")  # written after the capture has read the stream to its end
        assert second.wait(30)
    finally:
        stop.set()
        follower.join(30)

    assert not follower.is_alive()
    assert [r["eventName"] for r in written] == ["INSERT", "REMOVE"]
    assert written == as_captured(stack)


def test_a_replayed_capture_of_another_table_than_session_table_frees_nothing(worker_env, monkeypatch, tmp_path):
    stack = worker_env
    item = stack.put_session("re")
    stack.delete("re")
    stack.put_item(item)  # reconnected: the live item holds the same grant and prefix again
    other = f"{stack.table}-other"
    create_session_table(stack.ddb, other, view_type=None, ttl=False)
    monkeypatch.setenv("SESSION_TABLE", other)  # the sessions are elsewhere: the captured table's records are not
    out = tmp_path / "capture.jsonl"
    assert cli.main(["capture", "--table-name", stack.table, "--out", str(out)]) == 0

    code = cli.main(["replay", str(out)])

    assert code == 2  # every record is another table's: said, and a failure
    assert item["grantId"] in stack.grant_ids()  # skipped as another table's, not read in SESSION_TABLE and freed
    assert len(stack.objects(item["scratchPrefix"])) == 3
    assert {line.get("eventSourceARN") for line in lines(out)} == {stack.stream_arn}
