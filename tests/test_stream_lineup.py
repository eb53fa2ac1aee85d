"""A consumer that starts reads every earlier stream of its table with unfinished checkpoints before the latest one:
a restart (a deployment, a crash, a scheduled ``--until-idle`` run) at a stream change cleans the old stream's tail,
and a stream that is gone has its unfinished checkpoints reported lost once.

moto cannot keep a table's old stream readable beside its new one, nor make one gone: the streams are a stand-in
(``tests.stand_in_streams``) serving records moto wrote, and the table's current stream is changed in moto's own
backend. Everything else (sessions, cleaning, checkpoints, leases) is moto over HTTP and the worker's own code.
"""

from __future__ import annotations

import threading
from typing import Any

from cleanup.exceptions import CheckpointTableError
from cleanup.streams.follow import StreamFollower
from tests.faults import Faults
from tests.stand_in_streams import Shard, StandInStreams
from tests.test_poller import assert_cleaned, make_poller
from tests.test_poller_stream import logged, re_enable, run_command
from tests.waiting import WAIT_GUARD_SECONDS, wait_for

OLD_SHARD, NEW_SHARD = "shardId-00000001700000000000-0ld0ld00", "shardId-00000001800000000000-new0new0"


def sessions_deleted(stack: Any, *names: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    items = [stack.put_session(name) for name in names]
    for name in names:
        stack.delete(name)
    return items, stack.new_records()


def item(stack: Any, stream_arn: str, shard_id: str) -> dict[str, Any] | None:
    key = {"stream": {"S": stream_arn}, "shard": {"S": shard_id}}
    return stack.ddb.get_item(TableName=f"ckpt-{stack.table}", Key=key, ConsistentRead=True).get("Item")


def stop_after_first_batch(poller_box: list[Any]) -> Any:
    def hook(_shard: str, _outcomes: list[Any]) -> None:
        poller_box[0].request_stop()  # the process stops (a deployment, a crash) with the old stream half read

    return hook


def half_read_old_stream(stack: Any, old: list[dict[str, Any]]) -> StandInStreams:
    """The table's stream as it was (one open shard holding ``old``), read by a poller that stopped after its first
    batch of two records: the old stream's checkpoint is unfinished."""
    streams = StandInStreams(stack.table, {stack.stream_arn: [Shard(OLD_SHARD, old)]})
    box: list[Any] = []
    box.append(make_poller(stack, streams=streams, batch_size=2, hook=stop_after_first_batch(box)))
    box[0].run()
    saved = item(stack, stack.stream_arn, OLD_SHARD)
    assert saved is not None and saved["sequenceNumber"]["S"] == old[1]["dynamodb"]["SequenceNumber"]
    return streams


def test_a_restart_after_a_stream_change_cleans_the_old_streams_tail_before_the_new_stream(
    worker_env, monkeypatch, capsys
):
    stack = worker_env
    old_items, old = sessions_deleted(stack, "s0", "s1", "s2")
    streams = half_read_old_stream(stack, old)
    new_arn = re_enable(stack)  # the view type changed: the old stream is disabled (closed), the table names a new one
    streams.streams[stack.stream_arn][0].closed = True
    new_items, new = sessions_deleted(stack, "s3")
    streams.streams[new_arn] = [Shard(NEW_SHARD, new)]

    code = run_command(monkeypatch, stack, streams, "--table-name", stack.table, "--until-idle")

    assert code == 0
    assert_cleaned(stack, *old_items, *new_items)
    assert item(stack, stack.stream_arn, OLD_SHARD)["finished"]["BOOL"] is True
    read = [stream for stream, _shard in streams.reads]
    assert read.index(new_arn) > max(n for n, stream in enumerate(read) if stream == stack.stream_arn)
    [said] = logged(capsys, "an earlier stream of the table has unfinished checkpoints")
    assert (said["streamArn"], said["unfinishedShards"]) == (stack.stream_arn, [OLD_SHARD])


def test_a_gone_earlier_stream_is_reported_lost_once_and_forgotten(worker_env, monkeypatch, capsys):
    stack = worker_env
    _, old = sessions_deleted(stack, "s0", "s1", "s2")
    streams = half_read_old_stream(stack, old)
    new_arn = re_enable(stack)
    streams.streams[new_arn] = [Shard(NEW_SHARD, [])]
    streams.gone.add(stack.stream_arn)  # a day after it was disabled
    checkpoint = old[1]["dynamodb"]["SequenceNumber"]

    first = run_command(monkeypatch, stack, streams, "--table-name", stack.table, "--until-idle")
    lost = logged(capsys, "records lost")
    second = run_command(monkeypatch, stack, streams, "--table-name", stack.table, "--until-idle")

    assert first == 1 and second == 0
    assert [(line["shardId"], line["afterSequenceNumber"]) for line in lost] == [(OLD_SHARD, checkpoint)]
    assert logged(capsys, "records lost") == []
    assert item(stack, stack.stream_arn, OLD_SHARD) is None


def standing_by_on(follower: StreamFollower, stream_arn: str) -> bool:
    poller = follower._poller
    return poller is not None and poller.stream_arn == stream_arn and poller.summary.standby_polls > 0


def test_a_standby_stands_by_on_the_oldest_unfinished_streams_lease(stack):
    old_items, old = sessions_deleted(stack, "s0", "s1", "s2")
    streams = half_read_old_stream(stack, old)
    new_arn = re_enable(stack)
    streams.streams[stack.stream_arn][0].closed = True
    streams.streams[new_arn] = [Shard(NEW_SHARD, [])]
    holder = make_poller(stack, streams=streams)  # another consumer, on the old stream
    assert holder.lease.try_acquire()
    runtime = stack.runtime(checkpoint_table=f"ckpt-{stack.table}", lease_seconds=4)
    standby = StreamFollower(runtime, new_arn, table=stack.table, streams=streams)
    thread = threading.Thread(target=standby.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: standing_by_on(standby, stack.stream_arn), "the standby on the old stream's lease")
        assert streams.reads == [(stack.stream_arn, OLD_SHARD)]  # the first run's read only
        holder.lease.release()  # the holder stops: the standby takes the old stream over and reads it to its end
        wait_for(
            lambda: (item(stack, stack.stream_arn, OLD_SHARD) or {}).get("finished", {}).get("BOOL"),
            "the old stream read",
        )
    finally:
        standby.request_stop()
        thread.join(WAIT_GUARD_SECONDS)
    assert_cleaned(stack, *old_items)
    assert not thread.is_alive()


def test_a_checkpoint_table_that_refuses_the_scan_ends_the_run_naming_the_permission(stack):
    _, old = sessions_deleted(stack, "s0", "s1", "s2")
    streams = half_read_old_stream(stack, old)
    runtime = stack.runtime(checkpoint_table=f"ckpt-{stack.table}")
    Faults(runtime.clients.dynamodb, "Scan", "AccessDeniedException", status=400, times=10**9)
    follower = StreamFollower(runtime, stack.stream_arn, table=stack.table, streams=streams)

    try:
        follower.run(until_idle=True)
    except CheckpointTableError as exc:
        assert "dynamodb:Scan" in str(exc)
    else:
        raise AssertionError("the run went on without knowing the table's earlier streams")
