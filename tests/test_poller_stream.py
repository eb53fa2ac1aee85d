"""The poller follows its table's stream: a stream disabled and enabled again (how a table changes its view type)
is followed to the new one; a stream disabled for good, or gone, is said by the health check, and never crashes it.

moto cannot disable a stream and enable it again (later writes fail), nor close a shard: the streams here are
served from records moto wrote, and the table's current stream is changed in moto's own backend."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from botocore.exceptions import ClientError

from cleanup.aws.clients import Clients
from cleanup.streams.follow import StreamFollower
from tests.test_poller import ChildOnly, LineageStreams, assert_cleaned, checkpoint, make_poller
from tests.waiting import WAIT_GUARD_SECONDS, wait_for
from worker import cli
from worker import health as health_command
from worker import poller as poller_command
from worker.local.backend import DEFAULT_ACCOUNT_ID

OLD, NEW = LineageStreams.PARENT, LineageStreams.CHILD


def re_enable(stack: Any) -> str:
    """The table's stream, disabled and enabled again: the table names a new stream."""
    from moto.dynamodb.models import dynamodb_backends

    table = dynamodb_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].get_table(stack.table)
    table.latest_stream_label = "2099-01-01T00:00:00.000"
    return f"{stack.stream_arn.rsplit('/stream/', 1)[0]}/stream/{table.latest_stream_label}"


class TwoStreams(LineageStreams):
    """The old stream (one shard, closed: disabled) and, once the poller has looked at the old one, the new stream
    of the re-enabled table (one open shard)."""

    def __init__(self, stack: Any, old: list[dict[str, Any]], new: list[dict[str, Any]], *, enable: bool) -> None:
        super().__init__(old, new)
        self.stack, self.enable = stack, enable
        self.old_arn, self.new_arn = stack.stream_arn, ""

    def describe_stream(self, StreamArn: str, **_: Any) -> dict[str, Any]:
        if StreamArn == self.old_arn:
            if self.enable and not self.new_arn:
                self.new_arn = re_enable(self.stack)
            closed = {"ShardId": OLD, "SequenceNumberRange": {"EndingSequenceNumber": "9"}}
            return {"StreamDescription": {"Shards": [closed]}}
        assert StreamArn == self.new_arn, StreamArn
        return {"StreamDescription": {"Shards": [{"ShardId": NEW, "SequenceNumberRange": {}}]}}


class GoneStreams(LineageStreams):
    """A stream that no longer exists (24 hours after it was disabled)."""

    def describe_stream(self, StreamArn: str, **_: Any) -> dict[str, Any]:
        raise ClientError({"Error": {"Code": "ResourceNotFoundException", "Message": "gone"}}, "DescribeStream")


def three_sessions_deleted(stack: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    items = [stack.put_session(f"s{n}") for n in range(3)]
    for n in range(3):
        stack.delete(f"s{n}")
    return items, stack.new_records()


def run_command(monkeypatch: Any, stack: Any, streams: Any, *args: str) -> int:
    monkeypatch.setenv("CHECKPOINT_TABLE", f"ckpt-{stack.table}")
    monkeypatch.setattr(Clients, "streams", property(lambda _self: streams))
    return int(poller_command.main(cli.build_parser("run").parse_args(["run", *args])))


def logged(capsys: Any, message: str) -> list[dict[str, Any]]:
    """The command's log lines (JSON on stderr) that start with ``message``."""
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    return [line for line in lines if line["message"].startswith(message)]


def test_run_table_name_follows_the_tables_new_stream_once_the_old_one_is_drained(worker_env, monkeypatch, capsys):
    stack = worker_env
    items, records = three_sessions_deleted(stack)
    streams = TwoStreams(stack, records[:4], records[4:], enable=True)  # s0 in the old stream, s1 and s2 in the new

    code = run_command(monkeypatch, stack, streams, "--table-name", stack.table, "--until-idle")

    assert code == 0
    assert_cleaned(stack, *items)
    key = {"stream": {"S": streams.new_arn}, "shard": {"S": NEW}}
    saved = stack.ddb.get_item(TableName=f"ckpt-{stack.table}", Key=key, ConsistentRead=True)["Item"]
    assert saved["sequenceNumber"]["S"] == records[-1]["dynamodb"]["SequenceNumber"]
    assert checkpoint(stack, OLD)["finished"]["BOOL"] is True
    said = logged(capsys, "following the table's new stream")
    assert [(line["fromStream"], line["toStream"]) for line in said] == [(stack.stream_arn, streams.new_arn)]


def test_a_stream_that_is_gone_ends_the_run_with_its_unread_records_counted_lost_not_a_traceback(
    worker_env, monkeypatch, capsys
):
    stack = worker_env
    _, records = three_sessions_deleted(stack)
    make_poller(stack, streams=ChildOnly([], records[:2]), batch_size=2).run(until_idle=True)
    read = records[1]["dynamodb"]["SequenceNumber"]

    code = run_command(monkeypatch, stack, GoneStreams(records, []), "--table-name", stack.table, "--until-idle")

    assert code == 1
    lost = logged(capsys, "records lost")
    assert [(line["shardId"], line["afterSequenceNumber"]) for line in lost] == [(NEW, read)]


def health_says(stack: Any, tmp_path: Any, monkeypatch: Any, capsys: Any) -> str:
    monkeypatch.setenv("HEALTH_FILE", str(tmp_path / "health"))
    code = health_command.main(cli.build_parser("health").parse_args(["health"]))
    out = capsys.readouterr().out.strip()
    return out if code else "healthy"


@pytest.mark.parametrize(("streams", "reason"), [("disabled", "is disabled"), ("gone", "no longer exists")])
def test_the_health_check_names_a_stream_disabled_for_good_or_gone(
    stack, tmp_path, monkeypatch, capsys, streams, reason
):
    _, records = three_sessions_deleted(stack)
    fake = TwoStreams(stack, records, [], enable=False) if streams == "disabled" else GoneStreams(records, [])
    runtime = stack.runtime(checkpoint_table=f"ckpt-{stack.table}", health_file=str(tmp_path / "health"))
    follower = StreamFollower(runtime, stack.stream_arn, table=stack.table, streams=fake)
    thread = threading.Thread(target=follower.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: reason in health_says(stack, tmp_path, monkeypatch, capsys), f"a check saying {reason!r}")
        said = health_says(stack, tmp_path, monkeypatch, capsys)
    finally:
        follower.request_stop()
        thread.join(WAIT_GUARD_SECONDS)

    assert said.startswith("unhealthy:") and stack.stream_arn in said
    assert not thread.is_alive()
