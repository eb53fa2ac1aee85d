"""The KCL record processor sees its losses and warns before them: a checkpoint older than the stream's retention, or
a start at LATEST after a checkpoint, is RecordsLost with its range (once); a processor holding records that arrived
20 hours ago is unhealthy, paused or not.

``cleanup-worker kcl`` as a subprocess, driven over the multilang protocol by the stand-in daemon
(``tests.kcl_daemon``); the daemon says where the shard starts and how far behind the stream's tip a batch is
(``millisBehindLatest``), as the KCL does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.kcl_daemon import FakeDaemon, KinesisShard, kinesis_payload
from tests.test_health import fake_daemon_process, kcl_child, kcl_health  # noqa: F401 (fixtures)
from tests.waiting import wait_for
from worker.local.appconfig import LocalAgent, flag

DAY_AND_AN_HOUR_MS = 25 * 3600 * 1000


@pytest.fixture
def processor(aws, stack, tmp_path) -> Iterator[Any]:
    """Start ``cleanup-worker kcl`` children on the stack's shard, each from the start given (a checkpoint or a
    sentinel); every child is stopped after the test."""
    started: list[FakeDaemon] = []

    def start(sequence_number: str | None = None) -> FakeDaemon:
        env = {
            **aws.environment(),
            "SCRATCH_BUCKET": stack.bucket,
            "KMS_KEY_ID": stack.key_arn,
            "SESSION_TABLE": stack.table,
            "CHECKPOINT_TABLE": f"ckpt-{stack.table}",
            "RETRY_MAX_WAIT_SECONDS": "0.05",
        }
        child = FakeDaemon(env, tmp_path / f"stderr-{len(started)}.log")
        started.append(child)
        child.initialize(sequence_number)
        return child

    yield start
    for child in started:
        if child.child.poll() is None:
            child.kill()


def removals(stack: Any, shard: KinesisShard, *sessions: str) -> list[dict[str, Any]]:
    """New sessions deleted: their REMOVE records alone, as Kinesis records."""
    for session in sessions:
        stack.put_session(session)
    stack.new_records()
    for session in sessions:
        stack.delete(session)
    return shard.records(kinesis_payload(record, stack.table) for record in stack.new_records())


def deleted(stack: Any, shard: KinesisShard, session: str) -> list[dict[str, Any]]:
    stack.delete(session)
    return shard.records(kinesis_payload(record, stack.table) for record in stack.new_records())


def batch(child: FakeDaemon, records: list[dict[str, Any]], behind_ms: int = 0) -> None:
    child.send({"action": "processRecords", "records": records, "millisBehindLatest": behind_ms})


def lost(child: FakeDaemon) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in child.stderr().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("message", "").startswith("records lost")]


def test_a_checkpoint_read_through_before_the_trim_horizon_is_reported_lost_once(stack, processor):
    shard = KinesisShard()
    first, later = removals(stack, shard, "s1"), removals(stack, shard, "s2")
    behind = processor()
    batch(behind, first, behind_ms=DAY_AND_AN_HOUR_MS)  # the processor was a day behind the stream's tip
    assert behind.close() == 0
    checkpoint = first[-1]["sequenceNumber"]

    restarted = processor(checkpoint)
    batch(restarted, later)
    again = processor(checkpoint)
    batch(again, later)

    [loss] = lost(restarted)
    assert (loss["level"], loss["afterSequenceNumber"], loss["beforeSequenceNumber"]) == (
        "ERROR",
        checkpoint,
        later[0]["sequenceNumber"],
    )
    assert '"RecordsLost"' in restarted.stderr()
    assert lost(again) == []  # reported once
    assert restarted.close() == again.close() == 0


def test_a_start_at_latest_after_a_checkpoint_reports_the_records_it_skipped(stack, processor):
    shard = KinesisShard()
    items = {name: stack.put_session(name) for name in ("s1", "s2", "s3")}
    stack.new_records()
    first, skipped, later = (deleted(stack, shard, name) for name in ("s1", "s2", "s3"))
    caught_up = processor()
    batch(caught_up, first)
    assert caught_up.close() == 0

    restarted = processor("LATEST")  # the lease table was made again, at LATEST: s2's record is never delivered
    batch(restarted, later)

    [loss] = lost(restarted)
    assert (loss["afterSequenceNumber"], loss["beforeSequenceNumber"]) == (
        first[-1]["sequenceNumber"],
        later[0]["sequenceNumber"],
    )
    assert skipped and items["s2"]["grantId"] in stack.grant_ids()  # never delivered: reconcile frees it
    assert items["s3"]["grantId"] not in stack.grant_ids()
    assert restarted.close() == 0


def test_a_restart_from_a_fresh_checkpoint_loses_nothing(stack, processor):
    shard = KinesisShard()
    first, later = removals(stack, shard, "s1"), removals(stack, shard, "s2")
    caught_up = processor()
    batch(caught_up, first)
    assert caught_up.close() == 0

    restarted = processor(first[-1]["sequenceNumber"])
    batch(restarted, later)

    assert lost(restarted) == []
    assert restarted.close() == 0


def test_a_paused_processor_holding_records_that_arrived_21_hours_ago_fails_its_health_check(
    stack,
    tmp_path,
    kcl_child,  # noqa: F811 (a fixture)
    fake_daemon_process,  # noqa: F811 (a fixture)
):
    records = removals(stack, KinesisShard(arrived_ago=21 * 3600), "paused")
    with LocalAgent() as agent:
        agent.serve(flag(False))
        child = kcl_child(**agent.env())
        child.post({"action": "processRecords", "records": records, "millisBehindLatest": 0})
        wait_for(lambda: agent.requests >= 8, "the processor to keep reading the paused switch")
        answer = kcl_health(tmp_path, fake_daemon_process)

    assert answer.returncode == 1, answer.stdout
    assert "the oldest waiting record is 21.0 h old" in answer.stdout
    assert child.requests == []  # still held: nothing checkpointed
