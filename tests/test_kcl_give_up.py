"""A failing record's give-up clock survives the KCL processor's restarts.

A record is given up after MAX_RECORD_RETRY_SECONDS of failing. Each restart of ``cleanup-worker kcl`` (an
orchestrator replacing the task, a deployment, a crash) delivers the record again, from the shard's last checkpoint,
to a fresh process: the clock must go on from the first try, not start again, or a processor restarted more often
than the bound never gives the record up and its shard waits for as long as the dependency fails.

Scaled down: a 4 s give-up bound, a 1.5 s health bound, and a child killed after every second try of the record.
"""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest

from tests.kcl_daemon import KinesisShard, kinesis_payload
from tests.proxy import FaultPlan, FaultProxy
from tests.test_health import HELD_PAST_THE_BOUND, SCALED, fake_daemon_process, kcl_health  # noqa: F401 (a fixture)
from tests.test_kcl import RETRY_METRIC, daemon, dead_letters, new_queue, throttled_grants  # noqa: F401 (fixtures)
from tests.waiting import wait_for
from worker.local.appconfig import LocalAgent, flag

RESTARTS_GUARD = 30  # a hang guard: with the clock kept, the record is given up after a handful of restarts
OUTAGE_GIVE_UP_SECONDS = 20  # the outage's bound: 17 s between the first check and the kill, on a loaded machine


@pytest.mark.slow  # restarts a child until MAX_RECORD_RETRY_SECONDS of failing have passed
def test_a_record_failing_across_restarts_is_dead_lettered_after_max_record_retry_seconds_in_all(
    stack,
    daemon,  # noqa: F811 (a fixture)
    throttled_grants,  # noqa: F811 (a fixture)
    tmp_path,
):
    queue = new_queue()
    item = stack.put_session("keeps-failing")
    stack.delete("keeps-failing")
    records = removals(stack, KinesisShard())
    settings = {
        **throttled_grants,
        **SCALED,
        "MAX_RECORD_RETRY_SECONDS": "4",
        "DEAD_LETTER_QUEUE_URL": queue,
        "HEALTH_FILE": str(tmp_path / "health"),
    }

    children = 0
    while True:
        assert children < RESTARTS_GUARD, "the record was never given up"
        children += 1
        child = daemon(**settings)
        child.post({"action": "processRecords", "records": records, "millisBehindLatest": 0})
        wait_for(
            lambda: child.stderr().count(RETRY_METRIC) >= 2 or not child._lines.empty(),  # noqa: B023
            "two retries or a checkpoint",
        )
        if not child._lines.empty():  # given up: the checkpoint moves past the record
            child.await_status("processRecords")
            break
        child.kill()  # restarted from the last checkpoint: the record is delivered again

    [letter] = dead_letters(queue)
    print(f"given up by process {children}, at its try {letter['attempts']}")
    assert letter["sequenceNumber"] == records[0]["sequenceNumber"]
    assert child.checkpoints == [records[0]["sequenceNumber"]]
    assert children > 1
    assert item["grantId"] in stack.grant_ids()  # never freed: dead-lettered for a redrive
    assert child.close() == 0


@pytest.mark.slow  # an hour-long outage, scaled down to seconds
def test_an_outage_scaled_down_ends_with_every_record_cleaned_or_dead_lettered(
    stack,
    daemon,  # noqa: F811 (a fixture)
    aws,
    tmp_path,
    fake_daemon_process,  # noqa: F811 (a fixture)
):
    plan = FaultPlan(rate=0.0, rates={"kms:RetireGrant": 1.0}, kinds=("throttle",))  # KMS down for the whole test
    queue, answers = new_queue(), []

    def check(stage: str) -> subprocess.CompletedProcess[str]:
        answer = kcl_health(tmp_path, fake_daemon_process)
        answers.append((stage, answer.returncode, answer.stdout.strip()))
        return answer

    with FaultProxy(aws.endpoint_url, plan) as proxy, LocalAgent() as agent:
        settings = {
            **SCALED,
            **agent.env(),
            "AWS_ENDPOINT_URL": proxy.url,
            "MAX_RECORD_RETRY_SECONDS": str(OUTAGE_GIVE_UP_SECONDS),
            "DEAD_LETTER_QUEUE_URL": queue,
            "HEALTH_FILE": str(tmp_path / "health"),
        }
        items = {name: stack.put_session(name) for name in ("a", "b")}
        for name in items:
            stack.delete(name)
        shard = KinesisShard()
        first = removals(stack, shard)
        child = daemon(**settings)
        child.post({"action": "processRecords", "records": first, "millisBehindLatest": 0})
        wait_for(lambda: failing_seconds(child) >= 2 * float(SCALED["HEALTH_STALE_SECONDS"]), "failing past the bound")
        check("KMS down 3 s, records retried in place")
        child.kill()
        check("processor restarted by its orchestrator")

        child = daemon(**settings)  # the daemon delivers the batch again from the last checkpoint (none)
        child.process_records(first)
        check(f"both records given up after {OUTAGE_GIVE_UP_SECONDS} s of failing in all; dead-lettered")

        later = stack.put_session("c")
        stack.delete("c")
        second = removals(stack, shard)
        agent.serve(flag(False))
        child.post({"action": "processRecords", "records": second, "millisBehindLatest": 0})
        wait_for(lambda: "cleanup mode: paused" in child.stderr(), "the processor to see the pause")
        requests = agent.requests
        wait_for(lambda: agent.requests >= requests + 4, "the pause to last")
        check("paused by the kill switch")

        plan.rates["kms:RetireGrant"] = 0.0
        agent.serve(flag(True, "enforce"))
        child.await_status("processRecords")
        check("KMS back, switch on: cleaned")

    for stage, code, line in answers:
        print(f"{stage:<66} exit {code}: {line}")
    assert [code for _, code, _ in answers] == [0, 0, 0, 0, 0]
    assert sorted(letter["sequenceNumber"] for letter in dead_letters(queue)) == [r["sequenceNumber"] for r in first]
    assert {item["grantId"] for item in items.values()} <= stack.grant_ids()  # kept, for a redrive
    assert stack.objects(later["scratchPrefix"]) == [] and later["grantId"] not in stack.grant_ids()
    assert child.checkpoints == [first[-1]["sequenceNumber"], second[-1]["sequenceNumber"]]
    assert "retrying 2 record(s)" in answers[0][2] and "paused by the kill switch" in answers[3][2]


def failing_seconds(child: Any) -> float:
    """How long the oldest failing record has been failing, by the child's latest retry line (0 before any)."""
    seen = re.findall(r'"failingSeconds": ([0-9.]+)', child.stderr())
    return float(seen[-1]) if seen else 0.0


def removals(stack: Any, shard: KinesisShard) -> list[dict[str, Any]]:
    """The REMOVE records written since the last read (INSERTs left out)."""
    removes = [r for r in stack.new_records() if r["eventName"] == "REMOVE"]
    return shard.records(kinesis_payload(record, stack.table) for record in removes)
