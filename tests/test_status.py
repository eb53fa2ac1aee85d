"""``cleanup-worker status`` through the real CLI against moto: what it shows, and that it changes nothing."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from cleanup.streams.checkpoints import Checkpoint, CheckpointStore, ensure_table
from cleanup.streams.lease import Lease
from tests.stack import SessionStack, client
from tests.test_poller import checkpoint, make_poller, only_shard, sequence_numbers
from worker import cli
from worker.local.appconfig import LocalAgent, flag


@pytest.fixture
def status_env(worker_env: SessionStack, monkeypatch: pytest.MonkeyPatch) -> SessionStack:
    monkeypatch.setenv("CHECKPOINT_TABLE", f"ckpt-{worker_env.table}")
    return worker_env


def status(capsys: pytest.CaptureFixture[str], *options: str) -> tuple[int, Any]:
    code = cli.main(["status", *options])
    out = capsys.readouterr().out
    return code, json.loads(out) if "--json" in options else out


def test_status_shows_checkpoints_lag_lease_queues_and_mode_and_changes_nothing(status_env, capsys, monkeypatch):
    stack = status_env
    stack.put_session("a")
    stack.delete("a")
    make_poller(stack).run(until_idle=True)
    done = sequence_numbers(stack)[-1]
    stack.put_session("b")  # two records after the checkpoint: waiting
    lease = Lease(stack.ddb, f"ckpt-{stack.table}", stack.stream_arn, "worker-a", 20.0)
    assert lease.try_acquire()
    sqs = client("sqs")
    dead_letters = sqs.create_queue(QueueName=f"dlq-{stack.table}")["QueueUrl"]
    for n in range(2):
        sqs.send_message(QueueUrl=dead_letters, MessageBody=f"m{n}")
    monkeypatch.setenv("DEAD_LETTER_QUEUE_URL", dead_letters)

    code, report = status(capsys, "--table-name", stack.table, "--json")

    assert code == 0
    assert report["mode"]["mode"] == "enforce" and report["mode"]["killSwitch"] == "not configured"
    [shard] = report["poller"]["shards"]
    assert shard["checkpoint"] == done and shard["waiting"] == 1 and shard["lagSeconds"] >= 0
    assert report["poller"]["lease"]["holder"] == "worker-a"
    assert report["queues"]["deadLetter"]["messages"] == 2
    assert report["queues"]["deadLetter"]["oldestAgeSeconds"] == "unknown"  # moto keeps no SQS metrics
    assert report["lastSweep"]["at"] == "unknown"
    assert checkpoint(stack)["sequenceNumber"]["S"] == done
    attributes = sqs.get_queue_attributes(QueueUrl=dead_letters, AttributeNames=["ApproximateNumberOfMessages"])
    assert attributes["Attributes"]["ApproximateNumberOfMessages"] == "2"


def test_status_on_a_terminal_is_one_screen_of_lines(status_env, capsys):
    stack = status_env
    stack.put_session("a")
    make_poller(stack).run(until_idle=True)

    code, out = status(capsys, "--table-name", stack.table)

    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("mode         enforce (from environment")
    assert "lease        nobody" in lines
    assert any(line.startswith("shard        ") and line.endswith("caught up") for line in lines)
    assert lines[-1].startswith("last sweep   unknown")


def test_status_without_a_stream_is_a_usage_error(worker_env, capsys):
    assert cli.main(["status", "--table-name", "no-such-table"]) == 2


def test_status_shows_the_kill_switch_as_the_worker_reads_it(status_env, capsys, monkeypatch):
    stack = status_env
    stack.put_session("a")
    with LocalAgent() as agent:
        agent.serve(flag(False))
        for name, value in agent.env().items():
            monkeypatch.setenv(name, value)

        code, report = status(capsys, "--table-name", stack.table, "--json")

    assert code == 0
    assert report["mode"] | {"error": None} == {
        "environment": "enforce",
        "killSwitch": "configured",
        "mode": "paused",
        "source": "appconfig",
        "flag": "paused",
        "error": None,
    }


def test_status_shows_the_backlogs_depth_when_there_is_one(status_env, capsys, monkeypatch):
    stack = status_env
    make_poller(stack).run(until_idle=True)
    sqs = client("sqs")
    backlog = sqs.create_queue(QueueName=f"backlog-{stack.table}")["QueueUrl"]
    for n in range(3):
        sqs.send_message(QueueUrl=backlog, MessageBody=f"grant {n}")
    monkeypatch.setenv("BACKLOG_QUEUE_URL", backlog)

    code, report = status(capsys, "--table-name", stack.table, "--json")
    _, screen = status(capsys, "--table-name", stack.table)

    assert code == 0 and report["queues"]["backlog"]["messages"] == 3
    assert "backlog      3 messages (0 in flight)" in screen


@pytest.mark.parametrize("pin", ["at", "since"])
def test_status_counts_the_records_waiting_from_a_latest_starts_pin(status_env, capsys, monkeypatch, pin):
    stack = status_env
    stack.put_session("a")
    stack.delete("a")
    first = sequence_numbers(stack)[0]
    # A poller started at LATEST pinned the shard (at the first record it read, or at its start time) and has
    # cleaned nothing yet: both records wait from the pin, though LATEST itself would show none.
    table = f"ckpt-{stack.table}"
    ensure_table(stack.ddb, table)
    lease = Lease(stack.ddb, table, stack.stream_arn, "worker-a", 20.0)
    assert lease.try_acquire()
    saved = Checkpoint(None, at=first) if pin == "at" else Checkpoint(None, since=time.time() - 5)
    CheckpointStore(stack.ddb, table, stack.stream_arn, lease).save(only_shard(stack), saved)
    monkeypatch.setenv("START_POSITION", "LATEST")

    code, report = status(capsys, "--table-name", stack.table, "--json")
    _, screen = status(capsys, "--table-name", stack.table)

    assert code == 0
    [shard] = report["poller"]["shards"]
    assert shard["checkpoint"] is None and shard["waiting"] == 2
    if pin == "at":
        assert shard["pinnedAt"] == first and f"pinned at {first}" in screen
    else:
        assert "pinnedSince" in shard and "pinned since" in screen


# Losses and earlier streams: moto cannot trim a shard or keep an old stream, so the streams are a stand-in.
def stand_in(monkeypatch: pytest.MonkeyPatch, streams: Any) -> None:
    from cleanup.aws.clients import Clients

    monkeypatch.setattr(Clients, "streams", property(lambda _self: streams))


def test_status_shows_a_checkpoint_the_stream_trimmed_past_as_records_lost_not_as_lag(status_env, capsys, monkeypatch):
    from tests.stand_in_streams import Shard, StandInStreams

    stack = status_env
    for name in ("s0", "s1", "s2"):
        stack.put_session(name)
        stack.delete(name)
    records = stack.new_records()
    numbers = [r["dynamodb"]["SequenceNumber"] for r in records]
    streams = StandInStreams(stack.table, {stack.stream_arn: [Shard("shardId-1", records[:2])]})
    make_poller(stack, streams=streams, batch_size=2).run(until_idle=True)  # checkpoint: the second record
    streams.streams[stack.stream_arn] = [Shard("shardId-1", records, trimmed=4)]  # a day later, two records trimmed
    stand_in(monkeypatch, streams)

    code, report = status(capsys, "--table-name", stack.table, "--json")
    _, out = status(capsys, "--table-name", stack.table)

    assert code == 1
    [shard] = report["poller"]["shards"]
    assert shard["lost"] == {"after": numbers[1], "before": numbers[4], "why": "trimmed before they were read"}
    assert shard["waiting"] == 2
    [line] = [line for line in out.splitlines() if line.startswith("shard")]
    assert f"LOST: records after {numbers[1]} (trimmed before they were read); then 2 records waiting" in line


def test_status_lists_the_earlier_streams_the_poller_has_not_finished_and_the_gone_ones_as_lost(
    status_env, capsys, monkeypatch
):
    from tests.stand_in_streams import Shard
    from tests.test_poller_stream import re_enable
    from tests.test_stream_lineup import NEW_SHARD, OLD_SHARD, half_read_old_stream, sessions_deleted

    stack = status_env
    _, old = sessions_deleted(stack, "s0", "s1", "s2")
    streams = half_read_old_stream(stack, old)
    new_arn = re_enable(stack)
    streams.streams[new_arn] = [Shard(NEW_SHARD, [])]
    stand_in(monkeypatch, streams)
    checkpoint = old[1]["dynamodb"]["SequenceNumber"]

    _, readable = status(capsys, "--table-name", stack.table, "--json")
    streams.gone.add(stack.stream_arn)
    code, gone = status(capsys, "--table-name", stack.table, "--json")
    _, out = status(capsys, "--table-name", stack.table)

    assert readable["poller"]["stream"] == new_arn
    [earlier] = readable["earlierStreams"]
    assert earlier["stream"] == stack.stream_arn and [s["checkpoint"] for s in earlier["shards"]] == [checkpoint]
    [lost] = gone["earlierStreams"]
    assert lost["gone"] is True and lost["shards"][0]["shardId"] == OLD_SHARD and code == 1
    assert f"earlier      {stack.stream_arn} (gone: its unfinished shards are lost)" in out
