"""A loss is seen even where no position was kept, and each loss is reported once, with its shard and range.

moto never trims, splits or deletes a stream: the streams here are a stand-in (``tests.stand_in_streams``) serving
records moto wrote; the sessions, their cleaning and the checkpoint table are moto over HTTP.
"""

from __future__ import annotations

from typing import Any

from tests.stand_in_streams import Shard, StandInStreams
from tests.test_poller import assert_cleaned, make_poller
from tests.test_poller_stream import logged, run_command
from worker import poller as poller_command

PARENT, CHILD = "shardId-00000001700000000000-parent00", "shardId-00000001714400000000-child000"


def sessions_deleted(stack: Any, *names: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    items = [stack.put_session(name) for name in names]
    for name in names:
        stack.delete(name)
    return items, stack.new_records()


def number(record: dict[str, Any]) -> str:
    return str(record["dynamodb"]["SequenceNumber"])


def left(stack: Any, item: dict[str, Any]) -> bool:
    return len(stack.objects(item["scratchPrefix"])) == 3 and item["grantId"] in stack.grant_ids()


def test_a_trimmed_shard_with_no_checkpoint_and_a_childs_trimmed_head_are_reported_lost(stack):
    items, records = sessions_deleted(stack, "s0", "s1", "s2", "s3")
    parent, child = records[:5], records[5:]  # 4 INSERTs and s0's REMOVE; the REMOVEs of s1, s2 and s3
    streams = StandInStreams(stack.table, {stack.stream_arn: [Shard(PARENT, [])]})
    first = make_poller(stack, streams=streams).run(until_idle=True)  # the parent started: nothing in it yet
    # Then, while the poller was stopped for more than a day: the parent got its records, closed, split, and was
    # trimmed whole; the child's first record (s1's REMOVE) was trimmed too.
    streams.streams[stack.stream_arn] = [
        Shard(PARENT, parent, closed=True, trimmed=len(parent)),
        Shard(CHILD, child, parent=PARENT, trimmed=1),
    ]

    summary = make_poller(stack, streams=streams).run(until_idle=True)

    assert first.lost == []
    assert sorted(summary.lost, key=lambda lost: lost["shardId"]) == [
        {"shardId": PARENT, "after": None, "before": None},
        {"shardId": CHILD, "after": None, "before": number(child[1])},
    ]
    assert poller_command.exit_code(summary) == 1
    assert_cleaned(stack, items[2], items[3])
    assert left(stack, items[0]) and left(stack, items[1])  # lost: reconcile frees what they held


def test_a_first_record_past_the_shards_start_with_nothing_trimmed_is_no_loss(stack):
    items, records = sessions_deleted(stack, "s0")
    start = str(int(number(records[0])) - 5)  # numbering that leaves room before the first record
    streams = StandInStreams(stack.table, {stack.stream_arn: [Shard(CHILD, records, start=start)]})

    summary = make_poller(stack, streams=streams).run(until_idle=True)

    assert summary.lost == []
    assert (CHILD, "AT_SEQUENCE_NUMBER", start) in streams.iterators  # asked, and the service found it readable
    assert_cleaned(stack, *items)


def test_a_gone_streams_loss_is_reported_by_one_run_only(worker_env, monkeypatch, capsys):
    stack = worker_env
    _, records = sessions_deleted(stack, "s0", "s1", "s2")
    streams = StandInStreams(stack.table, {stack.stream_arn: [Shard(CHILD, records[:2])]})
    make_poller(stack, streams=streams, batch_size=2).run(until_idle=True)
    streams.streams[stack.stream_arn] = [Shard(CHILD, records)]
    streams.gone.add(stack.stream_arn)  # disabled for good, and a day later gone; the table names it still

    codes = [run_command(monkeypatch, stack, streams, "--table-name", stack.table, "--until-idle") for _ in range(3)]

    assert codes == [1, 0, 0]
    lost = logged(capsys, "records lost")
    assert [(line["shardId"], line["afterSequenceNumber"]) for line in lost] == [(CHILD, number(records[1]))]
