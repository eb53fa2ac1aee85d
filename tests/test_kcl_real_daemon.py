"""End to end with the real KCL MultiLangDaemon (the jars in the kclpy-ext wheel) running ``cleanup-worker kcl``.

moto stands in for AWS: the KCL's Kinesis client insists on HTTP/2, so moto is also served over h2c (same in-process
state as the ``aws`` fixture's server). moto cannot stream a table into Kinesis, so the test copies the table's change
records into a Kinesis stream in the Kinesis Data Streams for DynamoDB format, as DynamoDB would. The lease table is
created beforehand with one row per shard, which saves the KCL's randomised wait for an empty lease table.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import boto3
import pytest

from tests.kcl_daemon import kinesis_payload
from tests.proxy import FaultPlan, FaultProxy
from tests.waiting import wait_for
from worker.local.h2 import H2cMoto

pytestmark = pytest.mark.slow

JARS = Path(__import__("amazon_kclpy").__file__).parent / "jars"
WAIT_GUARD_SECONDS = 90.0  # a hang guard only
DEPLOYED_PROPERTIES = Path(__file__).resolve().parent.parent / "deploy" / "kcl" / "cleanup.properties"
QUICK = {  # the deployed file, pointed at the test's stream and made quick (see the notes on the real daemon)
    "regionName": "us-east-1",
    "metricsLevel": "NONE",
    "idleTimeBetweenReadsInMillis": "500",
    "shardSyncIntervalMillis": "1000",
    "failoverTimeMillis": "5000",
    "leaseAssignmentIntervalMillis": "2000",
    "parentShardPollIntervalMillis": "1000",
    "shutdownGraceMillis": "10000",
}


def properties(**values: str) -> str:
    """deploy/kcl/cleanup.properties with ``values`` (and ``QUICK``) in place of its own."""
    values = {**QUICK, **values}
    lines = []
    for line in DEPLOYED_PROPERTIES.read_text().splitlines():
        key = line.split("=", 1)[0].strip()
        setting = "=" in line and not line.startswith("#")
        lines.append(f"{key} = {values.pop(key)}" if setting and key in values else line)
    return "\n".join(lines + [f"{key} = {value}" for key, value in values.items()]) + "\n"


@pytest.fixture(scope="module")
def h2c(aws):
    with H2cMoto() as server:
        yield server


def put_changes(stack, stream: str) -> str:
    """Copy the table's new change records into the Kinesis stream; returns the last sequence number."""
    kinesis = boto3.client("kinesis", region_name="us-east-1")
    last = ""
    for record in stack.new_records():
        payload = kinesis_payload(record, stack.table)
        key = record["dynamodb"]["Keys"]["pk"]["S"]
        last = kinesis.put_record(StreamName=stream, Data=json.dumps(payload).encode(), PartitionKey=key)[
            "SequenceNumber"
        ]
    return last


def create_lease_table(application: str, stream: str) -> None:
    """The KCL's lease table with one fresh lease per shard, as the KCL would write it."""
    ddb = boto3.client("dynamodb", region_name="us-east-1")
    ddb.create_table(
        TableName=application,
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    for shard in boto3.client("kinesis", region_name="us-east-1").list_shards(StreamName=stream)["Shards"]:
        hash_range = shard["HashKeyRange"]
        item = {
            "leaseKey": {"S": shard["ShardId"]},
            "checkpoint": {"S": "TRIM_HORIZON"},
            "checkpointSubSequenceNumber": {"N": "0"},
            "leaseCounter": {"N": "0"},
            "ownerSwitchesSinceCheckpoint": {"N": "0"},
            "startingHashKey": {"S": hash_range["StartingHashKey"]},
            "endingHashKey": {"S": hash_range["EndingHashKey"]},
        }
        ddb.put_item(TableName=application, Item=item)


def checkpoint_of(application: str) -> str | None:
    ddb = boto3.client("dynamodb", region_name="us-east-1")
    items = ddb.scan(TableName=application)["Items"]
    return items[0]["checkpoint"]["S"] if items else None


@pytest.mark.skipif(shutil.which("java") is None, reason="the KCL MultiLangDaemon needs a Java runtime (`java`)")
def test_the_real_daemon_cleans_sessions_checkpoints_and_stops_on_sigterm(aws, h2c, stack, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    stream, application = f"session-changes-{suffix}", f"session-cleanup-{suffix}"
    boto3.client("kinesis", region_name="us-east-1").create_stream(StreamName=stream, ShardCount=1)
    create_lease_table(application, stream)
    explicit, expired = stack.put_session("e1"), stack.put_session("x1", ttl=int(time.time()) - 60)
    live = stack.put_session("live")
    stack.delete("e1")
    stack.expire("x1")
    last = put_changes(stack, stream)
    config = tmp_path / "cleanup.properties"
    executable = f"{Path(sys.executable).parent / 'cleanup-worker'} kcl"
    config.write_text(properties(executableName=executable, streamName=stream, applicationName=application))
    env = {
        **os.environ,
        **aws.environment(),
        "AWS_ENDPOINT_URL": h2c.endpoint_url,
        "AWS_CBOR_DISABLED": "true",
        "SCRATCH_BUCKET": stack.bucket,
        "KMS_KEY_ID": stack.key_arn,
        "SESSION_TABLE": stack.table,
    }
    log = tmp_path / "daemon.log"
    command = ["java", "-Xmx128m", "-XX:+UseSerialGC", "-Daws.cborEnabled=false", "-cp", f"{JARS}/*"]
    command += ["software.amazon.kinesis.multilang.MultiLangDaemon", "--properties-file", str(config)]
    with log.open("w") as output:
        daemon = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        wait_for(
            lambda: checkpoint_of(application) == last,
            "the checkpoint at the last record",
            limit=WAIT_GUARD_SECONDS,
            interval=0.25,
            log=log,
        )

        assert stack.objects(explicit["scratchPrefix"]) == stack.objects(expired["scratchPrefix"]) == []
        assert {explicit["grantId"], expired["grantId"]}.isdisjoint(stack.grant_ids())
        assert len(stack.objects(live["scratchPrefix"])) == 3 and live["grantId"] in stack.grant_ids()

        daemon.send_signal(signal.SIGTERM)
        daemon.wait(WAIT_GUARD_SECONDS)
        output = log.read_text()
        assert '"shutdown requested"' in output and "Process shutdown is complete" in output
        assert checkpoint_of(application) == last
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


def start_daemon(config: Path, env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """The MultiLangDaemon in a process group of its own (with its record processors)."""
    command = ["java", "-Xmx128m", "-XX:+UseSerialGC", "-Daws.cborEnabled=false", "-cp", f"{JARS}/*"]
    command += ["software.amazon.kinesis.multilang.MultiLangDaemon", "--properties-file", str(config)]
    with log.open("w") as output:
        return subprocess.Popen(
            command, env=env, stdout=output, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True
        )


def release_leadership(application: str) -> None:
    """Delete the killed worker's leader lock (KCL 3 assigns leases from its leader only; a dead leader's lock would
    hold for minutes), as its own lapse would in time."""
    ddb = boto3.client("dynamodb", region_name="us-east-1")
    table = f"{application}-CoordinatorState"
    for item in ddb.scan(TableName=table)["Items"]:
        if item.get("key", {}).get("S") == "Leader":
            ddb.delete_item(TableName=table, Key={"key": item["key"]})


def kill_group(daemon: subprocess.Popen[bytes]) -> None:
    """Kill the daemon and its record processors at once, as a container's end does."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(daemon.pid, signal.SIGKILL)
    daemon.wait()


@pytest.mark.skipif(shutil.which("java") is None, reason="the KCL MultiLangDaemon needs a Java runtime (`java`)")
def test_a_record_failing_across_a_daemon_restart_is_given_up_on_the_clock_kept_from_its_first_try(
    aws, h2c, stack, tmp_path
):
    suffix = uuid.uuid4().hex[:8]
    stream, application = f"session-changes-{suffix}", f"session-cleanup-{suffix}"
    boto3.client("kinesis", region_name="us-east-1").create_stream(StreamName=stream, ShardCount=1)
    create_lease_table(application, stream)
    queue = boto3.client("sqs", region_name="us-east-1").create_queue(QueueName=f"dlq-{suffix}")["QueueUrl"]
    item = stack.put_session("throttled")
    stack.delete("throttled")
    last = put_changes(stack, stream)
    config = tmp_path / "cleanup.properties"
    executable = f"{Path(sys.executable).parent / 'cleanup-worker'} kcl"
    config.write_text(properties(executableName=executable, streamName=stream, applicationName=application))
    plan = FaultPlan(rate=0.0, rates={"kms:RetireGrant": 1.0}, kinds=("throttle",))
    with FaultProxy(aws.endpoint_url, plan) as proxy:
        env = {
            **os.environ,
            **aws.environment(),
            "AWS_ENDPOINT_URL": h2c.endpoint_url,
            "AWS_ENDPOINT_URL_KMS": proxy.url,  # the processor's KMS calls, throttled; the daemon makes none
            "AWS_CBOR_DISABLED": "true",
            "SCRATCH_BUCKET": stack.bucket,
            "KMS_KEY_ID": stack.key_arn,
            "SESSION_TABLE": stack.table,
            "DEAD_LETTER_QUEUE_URL": queue,
            "MAX_RECORD_RETRY_SECONDS": "10",
            "HEALTH_STALE_SECONDS": "1.5",
            "SHUTDOWN_GRACE_SECONDS": "1",
            "RETRY_MAX_WAIT_SECONDS": "0.05",
            "BOTOCORE_MAX_ATTEMPTS": "1",
            "RETRY_ATTEMPTS": "1",
        }
        logs = [tmp_path / "first.log", tmp_path / "second.log"]
        first = start_daemon(config, env, logs[0], tmp_path)
        try:
            # The second attempt's line: the first try's time is kept (after the first attempt) before it begins.
            wait_for(lambda: '"attempt": 2,' in logs[0].read_text(), "a second attempt", log=logs[0])
        finally:
            kill_group(first)
        release_leadership(application)
        second = start_daemon(config, env, logs[1], tmp_path)  # takes the lease over once it lapses
        try:
            wait_for(lambda: checkpoint_of(application) == last, "the give-up", limit=WAIT_GUARD_SECONDS, log=logs[1])
        finally:
            kill_group(second)

    sqs = boto3.client("sqs", region_name="us-east-1")
    [message] = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)["Messages"]
    letter = json.loads(message["Body"])
    assert letter["sequenceNumber"] == last
    # Given up by the second processor within two tries: on its own clock, it would have tried for 10 s.
    assert letter["attempts"] <= 2, letter
    assert item["grantId"] in stack.grant_ids()


FAULT_ONCE = """
import os

if os.environ.get("FAULT_ONCE_FILE"):  # the test's fault: the core raises once, in the first processor that runs it
    import cleanup.streams.retry_in_place

    _run_batch = cleanup.streams.retry_in_place.run_batch

    def run_batch(*args, **kwargs):
        if not os.path.exists(os.environ["FAULT_ONCE_FILE"]):
            open(os.environ["FAULT_ONCE_FILE"], "w").close()
            raise RuntimeError("injected fault")
        return _run_batch(*args, **kwargs)

    cleanup.streams.retry_in_place.run_batch = run_batch
"""


@pytest.mark.skipif(shutil.which("java") is None, reason="the KCL MultiLangDaemon needs a Java runtime (`java`)")
def test_a_fault_in_the_processor_stops_the_daemon_unanswered_and_the_next_daemon_cleans_the_batch(
    aws, h2c, stack, tmp_path
):
    suffix = uuid.uuid4().hex[:8]
    stream, application = f"session-changes-{suffix}", f"session-cleanup-{suffix}"
    boto3.client("kinesis", region_name="us-east-1").create_stream(StreamName=stream, ShardCount=1)
    create_lease_table(application, stream)
    item = stack.put_session("s1")
    stack.delete("s1")
    last = put_changes(stack, stream)
    config = tmp_path / "cleanup.properties"
    executable = f"{Path(sys.executable).parent / 'cleanup-worker'} kcl"
    config.write_text(properties(executableName=executable, streamName=stream, applicationName=application))
    (tmp_path / "fault").mkdir()
    (tmp_path / "fault" / "sitecustomize.py").write_text(FAULT_ONCE)
    env = {
        **os.environ,
        **aws.environment(),
        "AWS_ENDPOINT_URL": h2c.endpoint_url,
        "AWS_CBOR_DISABLED": "true",
        "SCRATCH_BUCKET": stack.bucket,
        "KMS_KEY_ID": stack.key_arn,
        "SESSION_TABLE": stack.table,
        "PYTHONPATH": str(tmp_path / "fault"),
        "FAULT_ONCE_FILE": str(tmp_path / "fault" / "fired"),
    }
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    first = start_daemon(config, env, logs[0], tmp_path)
    try:
        wait_for(lambda: first.poll() is not None, "the daemon to stop", limit=WAIT_GUARD_SECONDS, log=logs[0])
    finally:
        kill_group(first)
    stopped_at = checkpoint_of(application)
    kept = len(stack.objects(item["scratchPrefix"]))
    release_leadership(application)
    second = start_daemon(config, env, logs[1], tmp_path)
    try:
        wait_for(lambda: checkpoint_of(application) == last, "the checkpoint", limit=WAIT_GUARD_SECONDS, log=logs[1])
    finally:
        kill_group(second)

    assert first.returncode != 0
    assert "injected fault" in logs[0].read_text()
    assert stopped_at != last and kept == 3  # the batch was left unanswered, uncleaned and not passed
    assert stack.objects(item["scratchPrefix"]) == [] and item["grantId"] not in stack.grant_ids()
