"""``cleanup-worker kcl`` as a subprocess, driven over the multilang protocol by a stand-in daemon."""

from __future__ import annotations

import json
import time
import uuid

import boto3
import pytest

from tests.kcl_daemon import SHARD_END, FakeDaemon, KinesisShard, kinesis_payload
from tests.proxy import FaultPlan, FaultProxy
from tests.waiting import wait_for
from worker.local.appconfig import LocalAgent, flag

RETRY_METRIC = '"RecordsRetried":'  # the metric's value in an EMF document


@pytest.fixture
def daemon(aws, stack, tmp_path):
    """Start a child with the stack's settings (plus overrides); every child is stopped after the test."""
    started: list[FakeDaemon] = []

    def start(**settings: str) -> FakeDaemon:
        env = {
            **aws.environment(),
            "SCRATCH_BUCKET": stack.bucket,
            "KMS_KEY_ID": stack.key_arn,
            "SESSION_TABLE": stack.table,
            "RETRY_MAX_WAIT_SECONDS": "0.05",
            **settings,
        }
        child = FakeDaemon(env, tmp_path / f"stderr-{len(started)}.log")
        started.append(child)
        child.initialize()
        return child

    yield start
    for child in started:
        if child.child.poll() is None:
            child.kill()


@pytest.fixture
def throttled_grants(aws):
    """Settings that send the child's calls through a proxy throttling every RetireGrant: a session with a grant
    keeps failing transiently (one try an attempt: attempts stay short on a loaded machine), and gives up after two
    seconds."""
    plan = FaultPlan(rate=0.0, rates={"kms:RetireGrant": 1.0}, kinds=("throttle",))
    with FaultProxy(aws.endpoint_url, plan) as proxy:
        yield {
            "AWS_ENDPOINT_URL": proxy.url,
            "MAX_RECORD_RETRY_SECONDS": "2",
            "BOTOCORE_MAX_ATTEMPTS": "1",
            "RETRY_ATTEMPTS": "1",
        }


def deletes(stack, shard: KinesisShard, *sessions: str) -> list[dict]:
    """Delete the sessions and return their stream records (and anything written before) as Kinesis records."""
    for session in sessions:
        stack.delete(session)
    return shard.records(kinesis_payload(record, stack.table) for record in stack.new_records())


def bad_session(stack, session_id: str) -> str:
    """A session whose scratch prefix lies outside the scratch root: cleaning it always fails. Returns that prefix."""
    prefix = f"elsewhere/{session_id}/"
    stack.s3.put_object(Bucket=stack.bucket, Key=f"{prefix}not-ours", Body=b"keep")
    stack.put_session(session_id, extra={"scratchPrefix": prefix})
    return prefix


def dead_letters(queue_url: str) -> list[dict]:
    sqs = boto3.client("sqs", region_name="us-east-1")
    messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", [])
    return [json.loads(message["Body"]) for message in messages]


def new_queue() -> str:
    return boto3.client("sqs", region_name="us-east-1").create_queue(QueueName=f"dlq-{uuid.uuid4().hex[:8]}")[
        "QueueUrl"
    ]


def test_a_batch_of_deletes_is_cleaned_and_checkpointed_at_its_last_record(stack, daemon):
    explicit, expired = stack.put_session("e1"), stack.put_session("x1", ttl=int(time.time()) - 60)
    live = stack.put_session("live")
    stack.expire("x1")
    records = deletes(stack, KinesisShard(), "e1")
    child = daemon()

    child.process_records(records)

    assert stack.objects(explicit["scratchPrefix"]) == stack.objects(expired["scratchPrefix"]) == []
    assert {explicit["grantId"], expired["grantId"]}.isdisjoint(stack.grant_ids())
    assert len(stack.objects(live["scratchPrefix"])) == 3 and live["grantId"] in stack.grant_ids()
    assert child.checkpoints == [records[-1]["sequenceNumber"]]
    assert child.close() == 0


def test_stdout_carries_only_protocol_messages(stack, daemon):
    stack.put_session("s1")
    records = deletes(stack, KinesisShard(), "s1")
    child = daemon(LOG_LEVEL="DEBUG")

    child.process_records(records)
    child.shutdown_requested()
    child.close()

    protocol = [json.loads(line) for line in child.stdout_lines if line.strip()]
    assert all("action" in message for message in protocol)
    assert [m["responseFor"] for m in protocol if m["action"] == "status"] == [
        "initialize",
        "processRecords",
        "shutdownRequested",
    ]
    assert '"SessionsCleaned"' in child.stderr() and '"record cleaned"' in child.stderr()


def test_unreadable_data_is_dead_lettered_by_sequence_number(stack, daemon):
    queue = new_queue()
    shard = KinesisShard()
    deep = b"[" * 200_000 + b"]" * 200_000  # JSON nested deeper than Python's parser recurses
    records = shard.records([b"", b"{not json", ["a", "list"], deep])
    records[0]["data"] = "%%% not base64 %%%"
    child = daemon(DEAD_LETTER_QUEUE_URL=queue, MAX_RECORD_ATTEMPTS="1")

    child.process_records(records)

    letters = dead_letters(queue)
    assert sorted(letter["sequenceNumber"] for letter in letters) == [r["sequenceNumber"] for r in records]
    assert child.checkpoints == [records[-1]["sequenceNumber"]]
    assert child.close() == 0


def test_a_failing_record_holds_the_checkpoint_before_it(stack, daemon):
    stack.put_session("before")
    bad = bad_session(stack, "bad")
    records = deletes(stack, KinesisShard(), "before", "bad")
    child = daemon(MAX_RECORD_ATTEMPTS="2")

    child.post({"action": "processRecords", "records": records, "millisBehindLatest": 0})
    first = child.next_message()
    assert first["action"] == "checkpoint"
    child.answer_checkpoint(first)
    wait_for(lambda: child.stderr().count(RETRY_METRIC) >= 3, "three retries of the failing record")

    assert first["sequenceNumber"] == records[-2]["sequenceNumber"]
    assert stack.objects(bad) == [f"{bad}not-ours"]
    assert '"RecordsStuck"' in child.stderr() and "DEAD_LETTER_QUEUE_URL is not set" in child.stderr()
    child.kill()


def test_a_record_failing_max_attempts_is_dead_lettered_and_the_shard_moves_on(stack, daemon):
    queue = new_queue()
    stack.put_session("before")
    bad_session(stack, "bad")
    stack.put_session("after")
    records = deletes(stack, KinesisShard(), "before", "bad", "after")
    child = daemon(DEAD_LETTER_QUEUE_URL=queue, MAX_RECORD_ATTEMPTS="3")

    child.process_records(records)

    bad_record = records[-2]["sequenceNumber"]
    assert [letter["sequenceNumber"] for letter in dead_letters(queue)] == [bad_record]
    assert child.checkpoints == [records[-3]["sequenceNumber"], records[-1]["sequenceNumber"]]
    assert child.stderr().count(RETRY_METRIC) == 2


def test_a_throttled_checkpoint_is_retried(stack, daemon):
    stack.put_session("s1")
    records = deletes(stack, KinesisShard(), "s1")
    child = daemon()
    child.checkpoint_errors = ["ThrottlingException", "ThrottlingException"]

    child.process_records(records)

    last = records[-1]["sequenceNumber"]
    assert [request["sequenceNumber"] for request in child.requests] == [last, last, last]
    assert child.checkpoints == [last]


def test_after_a_shutdown_exception_it_never_checkpoints_again(stack, daemon):
    shard = KinesisShard()
    stack.put_session("s1")
    first = deletes(stack, shard, "s1")
    child = daemon()
    child.checkpoint_errors = ["ShutdownException"]
    child.process_records(first)
    stack.put_session("s2")

    child.process_records(deletes(stack, shard, "s2"))
    child.shutdown_requested()

    assert len(child.requests) == 1 and child.checkpoints == []


def test_shutdown_requested_checkpoints_what_is_done(stack, daemon):
    stack.put_session("s1")
    records = deletes(stack, KinesisShard(), "s1")
    child = daemon()
    child.checkpoint_errors = ["ThrottlingException"] * 6  # the batch's own checkpoint gives up
    child.process_records(records)
    assert child.checkpoints == []

    child.shutdown_requested()

    assert child.checkpoints == [records[-1]["sequenceNumber"]]


def test_shard_end_is_checkpointed_when_every_record_is_clean(stack, daemon):
    stack.put_session("s1")
    records = deletes(stack, KinesisShard(), "s1")
    child = daemon()
    child.process_records(records)

    child.shard_ended()

    assert child.checkpoints == [records[-1]["sequenceNumber"], SHARD_END]


def test_after_a_lost_lease_a_later_batch_and_the_shard_end_are_left_to_the_new_owner(stack, daemon):
    shard = KinesisShard()
    stack.put_session("s1")
    first = deletes(stack, shard, "s1")
    child = daemon()
    child.checkpoint_errors = ["ShutdownException"]
    child.process_records(first)
    later = stack.put_session("s2")

    child.process_records(deletes(stack, shard, "s2"))
    child.shard_ended()

    assert SHARD_END not in child.checkpoints and len(child.requests) == 1
    assert len(stack.objects(later["scratchPrefix"])) == 3  # read again by the new owner, from the last checkpoint


def messages_until_exit(child: FakeDaemon) -> list[dict]:
    """The messages the child writes until it closes stdout or acknowledges the message in hand (answering
    checkpoints as the daemon would)."""
    written = []
    while (line := child._lines.get(timeout=60)) is not None:
        message = json.loads(line)
        written.append(message)
        if message["action"] == "status":
            break
        if message["action"] == "checkpoint":
            child.answer_checkpoint(message)
    return written


@pytest.mark.parametrize("error", ["InvalidStateException", "IllegalArgumentException", "SomethingNewException"])
def test_a_checkpoint_refused_other_than_for_a_lost_lease_exits_without_acknowledging_the_batch(stack, daemon, error):
    shard = KinesisShard()
    stack.put_session("s1")
    first = deletes(stack, shard, "s1")
    child = daemon()
    child.checkpoint_errors = [error]

    child.post({"action": "processRecords", "records": first, "millisBehindLatest": 0})
    written = messages_until_exit(child)

    assert [m["action"] for m in written] == ["checkpoint"]  # no status: the batch is not acknowledged
    assert child.child.wait(60) != 0
    assert child.checkpoints == []
    # The daemon then starts a processor again from the last checkpoint: the batch is delivered once more.
    again = daemon()
    again.process_records(first)
    assert again.checkpoints == [first[-1]["sequenceNumber"]]


def test_a_checkpoint_still_throttled_is_carried_by_the_next_one_and_every_batch_is_cleaned(stack, daemon):
    shard = KinesisShard()
    stack.put_session("s1")
    first = deletes(stack, shard, "s1")
    child = daemon()
    child.checkpoint_errors = ["ThrottlingException"] * 6  # the batch's own checkpoint gives up
    child.process_records(first)
    later = stack.put_session("s2")

    second = deletes(stack, shard, "s2")
    child.process_records(second)
    child.shard_ended()

    assert stack.objects(later["scratchPrefix"]) == [] and later["grantId"] not in stack.grant_ids()
    assert child.checkpoints == [second[-1]["sequenceNumber"], SHARD_END]


def test_lease_lost_stops_without_a_checkpoint(stack, daemon):
    stack.put_session("s1")
    records = deletes(stack, KinesisShard(), "s1")
    child = daemon()
    child.process_records(records)
    before = len(child.requests)

    child.lease_lost()

    assert len(child.requests) == before == 1
    assert child.close() == 0


@pytest.mark.slow  # waits MAX_RECORD_RETRY_SECONDS out
def test_a_record_failing_transiently_is_dead_lettered_after_max_record_retry_seconds(stack, daemon, throttled_grants):
    queue = new_queue()
    stack.put_session("before", grant=False)
    stuck = stack.put_session("stuck")
    after = stack.put_session("after", grant=False)
    records = deletes(stack, KinesisShard(), "before", "stuck", "after")
    child = daemon(DEAD_LETTER_QUEUE_URL=queue, **throttled_grants)

    child.process_records(records)

    letters = dead_letters(queue)
    assert [letter["sequenceNumber"] for letter in letters] == [records[-2]["sequenceNumber"]]
    assert "ThrottlingException" in letters[0]["error"]
    assert letters[0]["attempts"] == child.stderr().count(RETRY_METRIC) + 1 >= 2  # retried in place, then given up
    assert child.checkpoints == [records[-3]["sequenceNumber"], records[-1]["sequenceNumber"]]
    assert stack.objects(after["scratchPrefix"]) == []
    assert stuck["grantId"] in stack.grant_ids()
    assert child.close() == 0


@pytest.mark.slow  # waits MAX_RECORD_RETRY_SECONDS out
def test_without_a_queue_a_record_failing_transiently_past_the_bound_is_stuck(stack, daemon, throttled_grants):
    stack.put_session("before", grant=False)
    stack.put_session("stuck")
    records = deletes(stack, KinesisShard(), "before", "stuck")
    child = daemon(**throttled_grants)

    child.post({"action": "processRecords", "records": records, "millisBehindLatest": 0})
    first = child.next_message()
    child.answer_checkpoint(first)
    wait_for(lambda: '"RecordsStuck"' in child.stderr(), "the record to be reported stuck")

    assert first["sequenceNumber"] == records[-2]["sequenceNumber"]
    assert "DEAD_LETTER_QUEUE_URL is not set" in child.stderr()
    assert child.requests == [first]
    child.kill()


def test_a_dry_run_makes_no_checkpoint_and_deletes_nothing(stack, daemon):
    queue = new_queue()
    item = stack.put_session("s1")
    bad = bad_session(stack, "bad")
    records = deletes(stack, KinesisShard(), "s1", "bad")
    child = daemon(CLEANUP_MODE="dry-run", DEAD_LETTER_QUEUE_URL=queue, MAX_RECORD_ATTEMPTS="1")

    child.process_records(records)
    child.shard_ended()
    child.shutdown_requested()

    assert child.requests == []
    assert len(stack.objects(item["scratchPrefix"])) == 3 and item["grantId"] in stack.grant_ids()
    assert stack.objects(bad) == [f"{bad}not-ours"]
    assert dead_letters(queue) == []
    assert RETRY_METRIC not in child.stderr()  # the failing record is reported, not retried in place
    assert records[-1]["sequenceNumber"] in child.stderr()
    assert child.close() == 0


def test_records_sharing_a_sequence_number_are_tracked_by_sub_sequence_number(stack, daemon):
    # A KPL-aggregated Kinesis record is de-aggregated by the daemon into records with one sequence number and
    # sub-sequence numbers 0, 1...: the failing one must hold the checkpoint and be dead-lettered on its own.
    queue = new_queue()
    good = stack.put_session("good")
    bad = bad_session(stack, "bad")
    records = deletes(stack, KinesisShard(), "good", "bad")
    shared = records[-2]["sequenceNumber"]
    records[-1].update(sequenceNumber=shared, subSequenceNumber=1)
    child = daemon(DEAD_LETTER_QUEUE_URL=queue, MAX_RECORD_ATTEMPTS="3")

    child.process_records(records)

    [letter] = dead_letters(queue)
    assert (letter["sequenceNumber"], letter.get("subSequenceNumber"), letter["attempts"]) == (shared, 1, 3)
    assert [(r["sequenceNumber"], r["subSequenceNumber"]) for r in child.requests] == [(shared, 0), (shared, 1)]
    assert child.stderr().count(RETRY_METRIC) == 2
    assert stack.objects(good["scratchPrefix"]) == [] and stack.objects(bad) == [f"{bad}not-ours"]
    assert child.close() == 0


# The kill switch, read before every attempt of the in-place retries.
@pytest.fixture
def switch_agent():
    with LocalAgent() as agent:
        yield agent


@pytest.fixture
def throttled_then_lifted(aws):
    """Every RetireGrant throttled (one try an attempt, no give-up in sight) until ``plan.enabled = False``."""
    plan = FaultPlan(rate=0.0, rates={"kms:RetireGrant": 1.0}, kinds=("throttle",))
    with FaultProxy(aws.endpoint_url, plan) as proxy:
        settings = {
            "AWS_ENDPOINT_URL": proxy.url,
            "MAX_RECORD_RETRY_SECONDS": "3600",
            "BOTOCORE_MAX_ATTEMPTS": "1",
            "RETRY_ATTEMPTS": "1",
        }
        yield plan, settings


def retire_calls(plan: FaultPlan) -> int:
    return sum(count for call, count in plan.requests.items() if call.operation == "RetireGrant")


def switch_midway(stack, daemon, agent, throttled_then_lifted, body: bytes):
    """A session whose grant cannot be retired yet, retried in place; then the switch turned to ``body`` and the
    throttle lifted once the processor has seen it. Returns the child, the records, the item and the RetireGrant
    calls made until the processor saw the switch."""
    plan, settings = throttled_then_lifted
    item = stack.put_session("s1")
    records = deletes(stack, KinesisShard(), "s1")
    child = daemon(**agent.env(), **settings)
    child.post({"action": "processRecords", "records": records, "millisBehindLatest": 0})
    child.answer_checkpoint(child.next_message())  # the INSERT before it, clean
    wait_for(lambda: child.stderr().count(RETRY_METRIC) >= 2, "the grant's record to be retried in place")
    agent.serve(body)
    seen = "cleanup mode: paused" if body == flag(False) else "cleanup mode: dry-run"
    wait_for(lambda: seen in child.stderr(), "the processor to read the switch between two attempts")
    calls = retire_calls(plan)
    plan.enabled = False
    return child, records, item, calls


def test_a_pause_set_during_in_place_retries_stops_them_and_holds_the_record(
    stack, daemon, switch_agent, throttled_then_lifted
):
    agent = switch_agent
    child, records, item, calls = switch_midway(stack, daemon, agent, throttled_then_lifted, flag(False))
    plan = throttled_then_lifted[0]
    reads = agent.requests
    wait_for(lambda: agent.requests >= reads + 5, "the paused processor to read the switch again")

    assert retire_calls(plan) == calls  # no call once paused, though RetireGrant would now succeed
    assert item["grantId"] in stack.grant_ids()
    assert records[-1]["sequenceNumber"] not in [r["sequenceNumber"] for r in child.requests]

    agent.serve(flag(True, "enforce"))  # resumed: the record is cleaned and checkpointed
    child.await_status("processRecords")
    assert item["grantId"] not in stack.grant_ids()
    assert child.checkpoints[-1] == records[-1]["sequenceNumber"]


def test_a_dry_run_set_during_in_place_retries_frees_nothing_more_and_checkpoints_nothing(
    stack, daemon, switch_agent, throttled_then_lifted
):
    dry_run = flag(True, "dry-run")
    child, records, item, _ = switch_midway(stack, daemon, switch_agent, throttled_then_lifted, dry_run)

    child.await_status("processRecords")  # planned, and acknowledged: delivered again from the last checkpoint
    child.shutdown_requested()

    assert item["grantId"] in stack.grant_ids()
    assert records[-1]["sequenceNumber"] not in [r["sequenceNumber"] for r in child.requests]
