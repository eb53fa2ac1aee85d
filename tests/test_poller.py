"""The stream poller (``cleanup-worker run``) against moto over HTTP: cleaning, checkpoints, retries, lease, lineage."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from botocore.exceptions import ClientError

from cleanup.streams.checkpoints import ensure_table
from cleanup.streams.lease import Lease
from cleanup.streams.poller import StreamPoller
from tests.faults import Faults
from tests.proxy import FaultPlan, FaultProxy
from tests.stack import table_exists
from tests.waiting import wait_for
from worker import poller as poller_command

ROOT = Path(__file__).resolve().parent.parent
UNSAFE = {"scratchPrefix": "sessions/../other-tenant/"}


class FakeTime:
    """The poller's clock and sleep: backoffs and lease waits pass at once, in order."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.on_sleep: list[Any] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        for hook in self.on_sleep:
            hook()


def make_poller(stack: Any, fake: FakeTime | None = None, *, streams: Any = None, hook: Any = None, **overrides: Any):
    overrides.setdefault("checkpoint_table", f"ckpt-{stack.table}")
    fake = fake or FakeTime()
    return StreamPoller(
        stack.runtime(**overrides),
        stack.stream_arn,
        streams=streams,
        clock=fake.clock,
        sleep=fake.sleep,
        before_checkpoint=hook,
    )


def checkpoint(stack: Any, shard_id: str | None = None) -> dict[str, Any] | None:
    shard_id = shard_id or only_shard(stack)
    key = {"stream": {"S": stack.stream_arn}, "shard": {"S": shard_id}}
    return stack.ddb.get_item(TableName=f"ckpt-{stack.table}", Key=key, ConsistentRead=True).get("Item")


def checkpoint_table_exists(stack: Any) -> bool:
    return table_exists(stack.ddb, f"ckpt-{stack.table}")


def only_shard(stack: Any) -> str:
    return str(stack.streams.describe_stream(StreamArn=stack.stream_arn)["StreamDescription"]["Shards"][0]["ShardId"])


def sequence_numbers(stack: Any) -> list[str]:
    return [record["dynamodb"]["SequenceNumber"] for record in stack.new_records()]


def assert_cleaned(stack: Any, *items: dict[str, Any]) -> None:
    grants = stack.grant_ids()
    for item in items:
        assert stack.objects(item["scratchPrefix"]) == []
        assert item["grantId"] not in grants


def test_deleted_and_expired_sessions_are_cleaned_and_the_checkpoint_holds_the_last_record(stack):
    deleted, expired = stack.put_session("d1"), stack.put_session("e1")
    live = stack.put_session("live")
    stack.delete("d1")
    stack.expire("e1")

    summary = make_poller(stack).run(until_idle=True)

    assert_cleaned(stack, deleted, expired)
    assert len(stack.objects(live["scratchPrefix"])) == 3
    assert live["grantId"] in stack.grant_ids()
    assert (summary.records, summary.cleaned, summary.skipped, summary.failed) == (5, 2, 3, 0)
    assert checkpoint(stack)["sequenceNumber"]["S"] == sequence_numbers(stack)[-1]


def test_a_second_run_resumes_after_the_checkpoint(stack):
    stack.put_session("a")
    stack.delete("a")
    make_poller(stack).run(until_idle=True)
    later = stack.put_session("b")
    stack.delete("b")

    summary = make_poller(stack).run(until_idle=True)

    assert (summary.records, summary.cleaned, summary.skipped) == (2, 1, 1)
    assert_cleaned(stack, later)
    assert checkpoint(stack)["sequenceNumber"]["S"] == sequence_numbers(stack)[-1]


def test_a_failing_record_holds_the_checkpoint_before_it_and_retries_while_there_is_no_queue(stack):
    before, after = stack.put_session("before"), stack.put_session("after")
    stack.put_session("bad", extra=UNSAFE)
    stack.delete("before")
    stack.delete("bad")
    stack.delete("after")
    numbers = sequence_numbers(stack)

    summary = make_poller(stack, max_record_attempts=3).run(until_idle=True)

    assert summary.blocked == [numbers[4]]
    assert summary.failed == 3
    assert checkpoint(stack)["sequenceNumber"]["S"] == numbers[3]
    assert_cleaned(stack, before, after)
    assert len(stack.objects("sessions/t1/bad/")) == 3


def test_a_permanently_failing_record_goes_to_the_queue_after_its_last_attempt_and_the_shard_moves_on(stack):
    sqs = stack.runtime().clients.sqs
    queue = sqs.create_queue(QueueName=f"dlq-{stack.table}")["QueueUrl"]
    stack.put_session("bad", extra=UNSAFE)
    after = stack.put_session("after")
    stack.delete("bad")
    stack.delete("after")
    numbers = sequence_numbers(stack)

    summary = make_poller(stack, max_record_attempts=3, dead_letter_queue_url=queue).run(until_idle=True)

    messages = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)["Messages"]
    body = json.loads(messages[0]["Body"])
    assert len(messages) == 1 and body["sequenceNumber"] == numbers[2]
    assert body["record"]["eventSourceARN"] == stack.stream_arn
    assert (summary.failed, summary.dead_lettered, summary.blocked) == (2, 1, [])
    assert checkpoint(stack)["sequenceNumber"]["S"] == numbers[-1]
    assert_cleaned(stack, after)


@pytest.mark.slow  # a crash
def test_a_crash_after_cleaning_but_before_the_checkpoint_loses_no_record(stack):
    items = [stack.put_session(f"s{n}") for n in range(4)]
    for n in range(4):
        stack.delete(f"s{n}")
    batches: list[int] = []

    def crash_on_second_batch(_shard: str, outcomes: list[Any]) -> None:
        batches.append(len(outcomes))
        if len(batches) == 2:
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        make_poller(stack, hook=crash_on_second_batch, batch_size=3).run(until_idle=True)
    resumed = make_poller(stack, batch_size=3).run(until_idle=True)

    assert resumed.records == 8 - 3  # the first batch was checkpointed; the crashed one is read again
    assert_cleaned(stack, *items)
    assert checkpoint(stack)["sequenceNumber"]["S"] == sequence_numbers(stack)[-1]


def test_a_standby_consumes_nothing_until_the_lease_goes_unrenewed_then_takes_over(stack):
    item = stack.put_session("a")
    stack.delete("a")
    runtime = stack.runtime()
    ensure_table(runtime.clients.dynamodb, f"ckpt-{stack.table}")
    holder = Lease(runtime.clients.dynamodb, f"ckpt-{stack.table}", stack.stream_arn, "holder", 10)
    assert holder.try_acquire()
    fake = FakeTime()
    standby = make_poller(stack, fake, lease_seconds=10)
    read_while_held: list[int] = []

    def holder_renews_for_30_seconds() -> None:
        if fake.now < 1030:
            assert holder.renew()
            read_while_held.append(standby.summary.records)

    fake.on_sleep.append(holder_renews_for_30_seconds)
    summary = standby.run(until_idle=True)

    assert len(read_while_held) > 4 and set(read_while_held) == {0}
    assert summary.records == 2
    assert_cleaned(stack, item)
    assert not holder.renew()


def test_a_consumer_that_loses_its_lease_stops_without_checkpointing(stack):
    for n in range(3):
        stack.put_session(f"s{n}")

    def steal(_shard: str, _outcomes: list[Any]) -> None:
        stack.ddb.update_item(
            TableName=f"ckpt-{stack.table}",
            Key={"stream": {"S": stack.stream_arn}, "shard": {"S": "#lease"}},
            UpdateExpression="SET #o = :thief, version = version + :one",
            ExpressionAttributeNames={"#o": "owner"},
            ExpressionAttributeValues={":thief": {"S": "thief"}, ":one": {"N": "1"}},
        )

    summary = make_poller(stack, hook=steal, batch_size=1).run(until_idle=True)

    assert summary.lease_lost
    assert summary.records == 1
    assert "sequenceNumber" not in (checkpoint(stack) or {})  # the shard's item says it was started, no more


class LineageStreams:
    """A DynamoDB Streams client with a closed parent shard and its open child, serving records captured from moto."""

    PARENT, CHILD = "shardId-00000001-parent", "shardId-00000002-child"

    def __init__(self, parent: list[dict[str, Any]], child: list[dict[str, Any]]) -> None:
        self.records = {self.PARENT: parent, self.CHILD: child}
        self.reads: list[str] = []
        self._handlers: dict[str, Any] = {}
        self.meta = SimpleNamespace(events=self)

    def register(self, event: str, handler: Any, unique_id: str | None = None) -> None:
        self._handlers[event] = handler

    def describe_stream(self, StreamArn: str, **_: Any) -> dict[str, Any]:
        child = {"ShardId": self.CHILD, "ParentShardId": self.PARENT, "SequenceNumberRange": {}}
        parent = {"ShardId": self.PARENT, "SequenceNumberRange": {"EndingSequenceNumber": "9"}}
        return {"StreamDescription": {"Shards": [child, parent]}}  # the child first: order must not matter

    def get_shard_iterator(self, ShardId: str, ShardIteratorType: str, SequenceNumber: str = "", **_: Any) -> Any:
        numbers = [r["dynamodb"]["SequenceNumber"] for r in self.records[ShardId]]
        position = numbers.index(SequenceNumber) + 1 if ShardIteratorType == "AFTER_SEQUENCE_NUMBER" else 0
        return {"ShardIterator": f"{ShardId}|{position}"}

    def get_records(self, ShardIterator: str, Limit: int = 1000) -> dict[str, Any]:
        shard, position = ShardIterator.split("|")
        records = self.records[shard][int(position) : int(position) + Limit]
        end = int(position) + len(records)
        body: dict[str, Any] = {"Records": records}
        if shard == self.CHILD or end < len(self.records[shard]):
            body["NextShardIterator"] = f"{shard}|{end}"
        self.reads.append(shard)
        response = SimpleNamespace(content=json.dumps(body).encode())
        self._handlers["after-call.dynamodbstreams.GetRecords"](http_response=response)
        return body


def test_a_child_shard_is_read_only_after_its_parent_is_finished(stack):
    items = [stack.put_session(f"s{n}") for n in range(3)]
    for n in range(3):
        stack.delete(f"s{n}")
    records = stack.new_records()
    streams = LineageStreams(records[:4], records[4:])

    summary = make_poller(stack, streams=streams, batch_size=2).run(until_idle=True)

    assert streams.reads.index(LineageStreams.CHILD) > max(
        i for i, shard in enumerate(streams.reads) if shard == LineageStreams.PARENT
    )
    assert summary.finished_shards == [LineageStreams.PARENT]
    assert checkpoint(stack, LineageStreams.PARENT)["finished"]["BOOL"] is True
    assert checkpoint(stack, LineageStreams.CHILD)["sequenceNumber"]["S"] == records[-1]["dynamodb"]["SequenceNumber"]
    assert_cleaned(stack, *items)
    again = LineageStreams(records[:4], records[4:])
    make_poller(stack, streams=again).run(until_idle=True)
    assert again.reads == [LineageStreams.CHILD]


def test_sigterm_ends_the_command_with_exit_0_and_a_checkpoint(stack, aws, tmp_path):
    item = stack.put_session("a")
    stack.delete("a")
    last = sequence_numbers(stack)[-1]
    env = {
        **os.environ,
        **aws.environment(),
        "SCRATCH_BUCKET": stack.bucket,
        "KMS_KEY_ID": stack.key_arn,
        "CHECKPOINT_TABLE": f"ckpt-{stack.table}",
        "POLL_INTERVAL_SECONDS": "0.1",
        "METRICS_DESTINATION": "off",
    }
    log = (tmp_path / "stderr").open("w")
    command = [sys.executable, "-m", "worker.cli", "run", "--table-name", stack.table]
    process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_for(lambda: _saved(stack) == last, "the poller's checkpoint", limit=30, interval=0.1, alive=process)
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
    finally:
        process.kill()

    assert code == 0, (tmp_path / "stderr").read_text()
    assert checkpoint(stack)["sequenceNumber"]["S"] == last
    assert_cleaned(stack, item)
    lease = checkpoint(stack, "#lease")
    assert lease["owner"]["S"] == ""  # released: a standby takes over at once


def _saved(stack: Any) -> str | None:
    try:
        item = checkpoint(stack)
    except stack.ddb.exceptions.ResourceNotFoundException:
        return None
    return item.get("sequenceNumber", {}).get("S") if item else None


class TrimmedStreams(LineageStreams):
    """One open shard whose records before ``trimmed`` are gone, and whose first iterator has expired."""

    def __init__(self, records: list[dict[str, Any]], trimmed: int) -> None:
        super().__init__([], records)
        self.trimmed = trimmed
        self.expired_once = False

    def describe_stream(self, StreamArn: str, **_: Any) -> dict[str, Any]:
        return {"StreamDescription": {"Shards": [{"ShardId": self.CHILD, "SequenceNumberRange": {}}]}}

    def get_shard_iterator(self, ShardId: str, ShardIteratorType: str, SequenceNumber: str = "", **_: Any) -> Any:
        numbers = [r["dynamodb"]["SequenceNumber"] for r in self.records[ShardId]]
        if ShardIteratorType == "AFTER_SEQUENCE_NUMBER" and numbers.index(SequenceNumber) + 1 < self.trimmed:
            raise ClientError({"Error": {"Code": "TrimmedDataAccessException"}}, "GetShardIterator")
        if ShardIteratorType == "TRIM_HORIZON":
            return {"ShardIterator": f"{ShardId}|{self.trimmed}"}
        return super().get_shard_iterator(ShardId, ShardIteratorType, SequenceNumber)

    def get_records(self, ShardIterator: str, Limit: int = 1000) -> dict[str, Any]:
        if not self.expired_once:
            self.expired_once = True
            raise ClientError({"Error": {"Code": "ExpiredIteratorException"}}, "GetRecords")
        return super().get_records(ShardIterator, Limit)


def test_records_trimmed_before_they_were_read_are_reported_by_sequence_number(stack):
    items = [stack.put_session(f"s{n}") for n in range(3)]
    for n in range(3):
        stack.delete(f"s{n}")
    records = stack.new_records()
    make_poller(stack, streams=TrimmedStreams(records[:2], trimmed=0)).run(until_idle=True)

    summary = make_poller(stack, streams=TrimmedStreams(records, trimmed=4)).run(until_idle=True)

    numbers = [record["dynamodb"]["SequenceNumber"] for record in records]
    assert summary.lost == [{"shardId": LineageStreams.CHILD, "after": numbers[1], "before": numbers[4]}]
    assert summary.records == 2
    assert poller_command.exit_code(summary) == 1 and not summary.blocked  # `run --until-idle`: something undone
    assert_cleaned(stack, items[2])
    assert checkpoint(stack, LineageStreams.CHILD)["sequenceNumber"]["S"] == numbers[-1]


@pytest.mark.slow  # a crash
def test_a_consumer_killed_mid_run_is_resumed_by_the_next_without_losing_a_record(stack, aws, tmp_path):
    items = [stack.put_session(f"s{n}", objects=1) for n in range(10)]
    for n in range(10):
        stack.delete(f"s{n}")
    numbers = sequence_numbers(stack)
    env = {
        **os.environ,
        **aws.environment(),
        "SCRATCH_BUCKET": stack.bucket,
        "KMS_KEY_ID": stack.key_arn,
        "CHECKPOINT_TABLE": f"ckpt-{stack.table}",
        "BATCH_SIZE": "1",
        "METRICS_DESTINATION": "off",
    }
    command = [sys.executable, "-m", "worker.cli", "run", "--table-name", stack.table, "--until-idle"]
    process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _saved(stack) is not None, "a first checkpoint", limit=30, interval=0.1, alive=process)
    finally:
        process.kill()  # SIGKILL: no checkpoint flush, no lease release
        process.wait()
    killed_at = _saved(stack)

    resumed = make_poller(stack, lease_seconds=1).run(until_idle=True)

    assert resumed.records == len(numbers) - numbers.index(killed_at) - 1
    assert_cleaned(stack, *items)
    assert checkpoint(stack)["sequenceNumber"]["S"] == numbers[-1]


def failing_grants(poller: StreamPoller) -> None:
    """Every RetireGrant of the poller fails with a server error: a session with a grant keeps failing transiently.

    Not throttling: a service that throttles every request is paced to its floor, a fifth of a request a second, in
    real time (cleanup.aws.rate), which a fake clock cannot skip."""
    Faults(poller.runtime.clients.kms, "RetireGrant", "KMSInternalException", status=500, times=10**9)


def test_a_record_failing_transiently_goes_to_the_queue_after_max_record_retry_seconds_and_the_shard_moves_on(stack):
    sqs = stack.runtime().clients.sqs
    queue = sqs.create_queue(QueueName=f"dlq-{stack.table}")["QueueUrl"]
    stuck, after = stack.put_session("stuck"), stack.put_session("after", grant=False)
    stack.delete("stuck")
    stack.delete("after")
    numbers = sequence_numbers(stack)
    fake = FakeTime()
    attempts: list[tuple[float, bool]] = []  # (fake time, whether the stuck record was dead-lettered) per attempt

    def note(_shard: str, outcomes: list[Any]) -> None:
        mine = [o for o in outcomes if o.sequence_number == numbers[2]]
        if mine:
            attempts.append((fake.now, mine[0].dead_lettered))

    poller = make_poller(
        stack, fake, hook=note, dead_letter_queue_url=queue, max_record_retry_seconds=30, botocore_max_attempts=1
    )
    failing_grants(poller)
    summary = poller.run(until_idle=True)

    messages = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)["Messages"]
    body = json.loads(messages[0]["Body"])
    assert len(messages) == 1 and body["sequenceNumber"] == numbers[2]
    assert "KMSInternalException" in body["error"]
    assert body["attempts"] == len(attempts) == summary.failed + 1
    assert [dead for _, dead in attempts] == [False] * (len(attempts) - 1) + [True]
    assert attempts[-1][0] - attempts[0][0] >= 30 > attempts[-2][0] - attempts[0][0]
    assert (summary.dead_lettered, summary.blocked) == (1, [])
    assert checkpoint(stack)["sequenceNumber"]["S"] == numbers[-1]
    assert stuck["grantId"] in stack.grant_ids()  # left for the redrive
    assert stack.objects(after["scratchPrefix"]) == []


def test_without_a_queue_a_record_failing_transiently_past_max_record_retry_seconds_blocks_the_shard(stack, caplog):
    stack.put_session("stuck")
    after = stack.put_session("after", grant=False)
    stack.delete("stuck")
    stack.delete("after")
    numbers = sequence_numbers(stack)
    fake = FakeTime()
    poller = make_poller(stack, fake, max_record_retry_seconds=30, botocore_max_attempts=1)
    failing_grants(poller)

    summary = poller.run(until_idle=True)

    assert summary.blocked == [numbers[2]]
    assert fake.now - 1000 >= 30
    assert checkpoint(stack)["sequenceNumber"]["S"] == numbers[1]
    assert any(r.levelname == "ERROR" and "DEAD_LETTER_QUEUE_URL is not set" in r.getMessage() for r in caplog.records)
    assert stack.objects(after["scratchPrefix"]) == []


def test_run_until_idle_ends_with_exit_1_naming_a_record_that_kept_failing_transiently(stack, aws):
    stack.put_session("stuck")
    stack.delete("stuck")
    stuck = sequence_numbers(stack)[-1]
    plan = FaultPlan(rate=0.0, rates={"kms:RetireGrant": 1.0}, kinds=("throttle",))
    with FaultProxy(aws.endpoint_url, plan) as proxy:
        env = worker_command_env(stack, aws, proxy.url, MAX_RECORD_RETRY_SECONDS="1", BOTOCORE_MAX_ATTEMPTS="1")
        command = [sys.executable, "-m", "worker.cli", "run", "--table-name", stack.table, "--until-idle"]
        result = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)

    assert result.returncode == 1, result.stderr[-2000:]
    stopped = [json.loads(line) for line in result.stderr.splitlines() if '"poller stopped"' in line]
    assert stopped[0]["summary"]["blocked"] == [stuck]
    assert plan.by_call[("kms", "RetireGrant", "throttle")] > 1


def worker_command_env(stack: Any, aws: Any, endpoint_url: str, **settings: str) -> dict[str, str]:
    return {
        **os.environ,
        **aws.environment(),
        "AWS_ENDPOINT_URL": endpoint_url,
        "SCRATCH_BUCKET": stack.bucket,
        "KMS_KEY_ID": stack.key_arn,
        "CHECKPOINT_TABLE": f"ckpt-{stack.table}",
        "RETRY_MAX_WAIT_SECONDS": "0.05",
        "METRICS_DESTINATION": "off",
        **settings,
    }


@pytest.mark.parametrize("operation", ["DescribeTable", "Query"])
def test_a_throttled_checkpoint_table_is_waited_out(stack, operation):
    item = stack.put_session("a")
    stack.delete("a")
    poller = make_poller(stack, botocore_max_attempts=1)
    throttled = Faults(poller.runtime.clients.dynamodb, operation, "ThrottlingException", times=12)

    summary = poller.run(until_idle=True)

    assert throttled.remaining == 0
    assert summary.records == 2
    assert_cleaned(stack, item)
    assert checkpoint(stack)["sequenceNumber"]["S"] == sequence_numbers(stack)[-1]


class ChildOnly(LineageStreams):
    """The same stream once its parent shard has left it (trimmed 24 h after it closed)."""

    def describe_stream(self, StreamArn: str, **_: Any) -> dict[str, Any]:
        return {"StreamDescription": {"Shards": [{"ShardId": self.CHILD, "SequenceNumberRange": {}}]}}


def test_a_throttled_forget_of_a_vanished_shard_is_retried(stack):
    items = [stack.put_session(f"s{n}") for n in range(3)]
    for n in range(2):
        stack.delete(f"s{n}")
    records = stack.new_records()
    make_poller(stack, streams=LineageStreams(records[:4], records[4:])).run(until_idle=True)
    stack.delete("s2")
    records += stack.new_records()
    poller = make_poller(stack, streams=ChildOnly([], records[4:]), botocore_max_attempts=1, shard_discovery_seconds=1)
    throttled = Faults(poller.runtime.clients.dynamodb, "TransactWriteItems", "ThrottlingException", times=6)

    summary = poller.run(until_idle=True)

    assert throttled.remaining == 0
    assert checkpoint(stack, LineageStreams.PARENT) is None
    assert checkpoint(stack, LineageStreams.CHILD)["sequenceNumber"]["S"] == records[-1]["dynamodb"]["SequenceNumber"]
    assert summary.lost == []
    assert_cleaned(stack, *items)


def test_when_the_last_checkpoint_cannot_be_written_on_the_way_out_the_poller_says_so_and_stops(stack, caplog):
    items = [stack.put_session(f"s{n}") for n in range(2)]
    for n in range(2):
        stack.delete(f"s{n}")
    poller: StreamPoller | None = None

    def sigterm_and_a_failing_table(_shard: str, _outcomes: list[Any]) -> None:
        assert poller is not None
        poller.request_stop()  # what SIGTERM does
        Faults(poller.runtime.clients.dynamodb, "TransactWriteItems", "InternalServerError", status=500, times=10**9)

    poller = make_poller(stack, hook=sigterm_and_a_failing_table, botocore_max_attempts=1)
    summary = poller.run(until_idle=True)

    assert summary.records == 4 and summary.checkpoints == {}
    assert "sequenceNumber" not in (checkpoint(stack) or {})  # the shard's item says it was started, no more
    said = [r for r in caplog.records if "will be read again" in r.getMessage()]
    assert len(said) == 1 and said[0].shardId == only_shard(stack)
    resumed = make_poller(stack).run(until_idle=True)
    assert resumed.records == 4  # read again, not lost
    assert_cleaned(stack, *items)
    assert checkpoint(stack)["sequenceNumber"]["S"] == sequence_numbers(stack)[-1]


@pytest.mark.parametrize(
    ("operation", "permissions"),
    [
        # Each case starts the command in a process of its own: the fast tier keeps one, the full suite has all.
        pytest.param("DescribeTable", ["dynamodb:DescribeTable"], marks=pytest.mark.slow),
        pytest.param("CreateTable", ["dynamodb:CreateTable"], marks=pytest.mark.slow),
        pytest.param("Query", ["dynamodb:Query"], marks=pytest.mark.slow),
        ("TransactWriteItems", ["dynamodb:PutItem", "dynamodb:ConditionCheckItem"]),
        pytest.param("GetItem", ["dynamodb:GetItem"], marks=pytest.mark.slow),
        pytest.param("UpdateItem", ["dynamodb:UpdateItem"], marks=pytest.mark.slow),
    ],
)
def test_a_checkpoint_table_denied_to_the_worker_ends_run_with_exit_2_and_one_line(stack, aws, operation, permissions):
    stack.put_session("a")
    stack.delete("a")
    plan = FaultPlan(rate=0.0, rates={f"dynamodb:{operation}": 1.0}, kinds=("access-denied",))
    with FaultProxy(aws.endpoint_url, plan) as proxy:
        env = worker_command_env(stack, aws, proxy.url)
        command = [sys.executable, "-m", "worker.cli", "run", "--stream-arn", stack.stream_arn, "--until-idle"]
        result = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)

    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    errors = [json.loads(line) for line in result.stderr.splitlines() if '"level": "ERROR"' in line]
    assert len(errors) == 1, result.stderr[-2000:]
    assert f"ckpt-{stack.table}" in errors[0]["message"]
    assert all(permission in errors[0]["message"] for permission in permissions)
    assert plan.injected == {"access-denied": 1}


def test_a_dry_run_consumes_nothing_and_a_later_enforce_run_cleans_everything(stack):
    sqs = stack.runtime().clients.sqs
    queue = sqs.create_queue(QueueName=f"dlq-{stack.table}")["QueueUrl"]
    items = [stack.put_session(f"s{n}") for n in range(3)]
    stack.put_session("bad", extra=UNSAFE)
    for session in ("s0", "bad", "s1", "s2"):
        stack.delete(session)
    numbers = sequence_numbers(stack)
    settings = {"dead_letter_queue_url": queue, "max_record_attempts": 1, "batch_size": 3}

    dry = make_poller(stack, cleanup_mode="dry-run", **settings).run(until_idle=True)

    assert (dry.records, dry.failed, dry.dead_lettered, dry.blocked, dry.checkpoints) == (len(numbers), 1, 0, [], {})
    assert not checkpoint_table_exists(stack)  # nothing written: not even the table
    assert sqs.receive_message(QueueUrl=queue).get("Messages", []) == []
    assert all(len(stack.objects(item["scratchPrefix"])) == 3 for item in items)
    assert {item["grantId"] for item in items} <= stack.grant_ids()

    enforce = make_poller(stack, **settings).run(until_idle=True)

    assert (enforce.records, enforce.dead_lettered) == (len(numbers), 1)
    assert_cleaned(stack, *items)
    assert checkpoint(stack)["sequenceNumber"]["S"] == numbers[-1]


def test_a_dry_run_reads_a_child_shard_after_its_parent_and_marks_neither(stack):
    items = [stack.put_session(f"s{n}") for n in range(3)]
    for n in range(3):
        stack.delete(f"s{n}")
    records = stack.new_records()
    streams = LineageStreams(records[:4], records[4:])

    summary = make_poller(stack, streams=streams, batch_size=2, cleanup_mode="dry-run").run(until_idle=True)

    assert summary.finished_shards == [LineageStreams.PARENT] and summary.records == len(records)
    assert streams.reads[-1] == LineageStreams.CHILD
    assert not checkpoint_table_exists(stack)
    assert all(len(stack.objects(item["scratchPrefix"])) == 3 for item in items)


def test_a_dry_run_keeps_the_checkpoint_of_a_vanished_shard(stack):
    stack.put_session("a")
    stack.delete("a")
    records = stack.new_records()
    make_poller(stack, streams=LineageStreams(records[:1], records[1:])).run(until_idle=True)

    make_poller(stack, streams=ChildOnly([], records[1:]), cleanup_mode="dry-run").run(until_idle=True)

    assert checkpoint(stack, LineageStreams.PARENT)["finished"]["BOOL"] is True


def test_a_dry_run_reads_beside_the_consumer_holding_the_lease_and_leaves_it_alone(stack):
    # An operator previews a configuration while the enforce consumer runs: the preview must neither wait for the
    # lease nor take it (the consumer would stand by, and expired sessions wait), and it starts at the checkpoints.
    items = [stack.put_session(f"s{n}") for n in range(4)]
    stack.delete("s0")
    make_poller(stack).run(until_idle=True)  # the enforce consumer's checkpoint: after s0
    for n in range(1, 4):
        stack.delete(f"s{n}")
    table = f"ckpt-{stack.table}"
    holder = Lease(stack.ddb, table, stack.stream_arn, "enforce-consumer", 20.0)
    assert holder.try_acquire()
    lease_key = {"stream": {"S": stack.stream_arn}, "shard": {"S": "#lease"}}
    lease_before = stack.ddb.get_item(TableName=table, Key=lease_key, ConsistentRead=True)["Item"]
    saved = checkpoint(stack)

    dry = make_poller(stack, cleanup_mode="dry-run").run(until_idle=True)

    assert (dry.records, dry.failed, dry.standby_polls, dry.lease_lost) == (3, 0, 0, False)
    assert stack.ddb.get_item(TableName=table, Key=lease_key, ConsistentRead=True)["Item"] == lease_before
    assert holder.renew() and checkpoint(stack) == saved
    assert all(len(stack.objects(item["scratchPrefix"])) == 3 for item in items[1:])


class ParentLeavesTheStream(LineageStreams):
    """The parent shard is listed once, then leaves the stream (trimmed) while its first page is still in hand: a
    second read of it finds it gone."""

    def __init__(self, parent: list[dict[str, Any]], child: list[dict[str, Any]]) -> None:
        super().__init__(parent, child)
        self.listings = 0

    def describe_stream(self, StreamArn: str, **_: Any) -> dict[str, Any]:
        self.listings += 1
        if self.listings == 1:
            return super().describe_stream(StreamArn)
        return {"StreamDescription": {"Shards": [{"ShardId": self.CHILD, "ParentShardId": self.PARENT}]}}

    def get_records(self, ShardIterator: str, Limit: int = 1000) -> dict[str, Any]:
        if not ShardIterator.startswith(self.PARENT):
            return super().get_records(ShardIterator, Limit)
        self.reads.append(self.PARENT)
        if self.reads.count(self.PARENT) > 1:
            raise ClientError({"Error": {"Code": "ResourceNotFoundException"}}, "GetRecords")
        body = {"Records": self.records[self.PARENT], "NextShardIterator": f"{self.PARENT}|end"}  # more to come
        self._handlers["after-call.dynamodbstreams.GetRecords"](
            http_response=SimpleNamespace(content=json.dumps(body).encode())
        )
        return body


def test_a_shard_that_leaves_the_stream_while_its_records_are_retried_is_finished_then_its_children_read(stack):
    items = [stack.put_session(f"s{n}") for n in range(3)]
    for n in range(3):
        stack.delete(f"s{n}")
    records = stack.new_records()
    parent, child = records[:4], records[4:]  # the parent: 3 INSERTs and s0's REMOVE; the child: the rest
    streams = ParentLeavesTheStream(parent, child)
    poller = make_poller(stack, streams=streams, batch_size=4, botocore_max_attempts=1, shard_discovery_seconds=1)
    Faults(poller.runtime.clients.kms, "RetireGrant", "KMSInternalException", status=500, times=3)  # s0 retried

    summary = poller.run(until_idle=True)

    last_of_parent = parent[-1]["dynamodb"]["SequenceNumber"]
    assert summary.lost == [{"shardId": LineageStreams.PARENT, "after": last_of_parent, "before": None}]
    assert streams.reads.index(LineageStreams.CHILD) > max(
        n for n, shard in enumerate(streams.reads) if shard == LineageStreams.PARENT
    )
    assert summary.blocked == [] and summary.records == len(records)
    assert_cleaned(stack, *items)
    assert checkpoint(stack, LineageStreams.PARENT) is None
