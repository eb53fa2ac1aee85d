"""End to end with the real KCL MultiLangDaemon (the jars in the kclpy-ext wheel) running ``cleanup-worker kcl``.

moto stands in for AWS: the KCL's Kinesis client insists on HTTP/2, so moto is also served over h2c (same in-process
state as the ``aws`` fixture's server). moto cannot stream a table into Kinesis, so the test copies the table's change
records into a Kinesis stream in the Kinesis Data Streams for DynamoDB format, as DynamoDB would. The lease table is
created beforehand with one row per shard, which saves the KCL's randomised wait for an empty lease table.
"""

from __future__ import annotations

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
