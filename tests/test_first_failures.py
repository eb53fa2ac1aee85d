"""The first-try times of failing records (CHECKPOINT_TABLE): they expire once no stream can deliver their record."""

from __future__ import annotations

from cleanup.streams.first_failures import STREAM_RETENTION_SECONDS, FirstFailures
from tests.proxy import FaultPlan, FaultProxy
from tests.scenarios.helpers import ProxiedClients


def test_a_first_try_time_expires_a_stream_retention_and_the_give_up_bound_after_the_first_try(stack):
    table = f"ckpt-{stack.table}"
    settings = stack.settings(checkpoint_table=table, max_record_retry_seconds=600.0)
    store = FirstFailures(stack.ddb, settings, stack.table, "shardId-1")

    store.note("100", 1_000_000.5)

    key = {"stream": {"S": f"failing#{stack.table}#shardId-1"}, "shard": {"S": "100"}}
    item = stack.ddb.get_item(TableName=table, Key=key, ConsistentRead=True)["Item"]
    assert STREAM_RETENTION_SECONDS == 24 * 3600
    # Past this, the stream has trimmed the record and the give-up bound has run out: nothing reads the time again.
    assert int(item["expiresAt"]["N"]) == 1_000_000 + 24 * 3600 + 600 + 1  # rounded up
    assert store.recall() == {"100": 1_000_000.5}


def test_the_checkpoint_table_a_worker_creates_expires_items_on_their_expiry_attribute(stack):
    table = f"ckpt-{stack.table}"
    store = FirstFailures(stack.ddb, stack.settings(checkpoint_table=table), stack.table, "shardId-1")

    store.note("100", 1_000_000.0)

    described = stack.ddb.describe_time_to_live(TableName=table)["TimeToLiveDescription"]
    assert described == {"TimeToLiveStatus": "ENABLED", "AttributeName": "expiresAt"}


def test_a_ttl_refused_to_the_worker_leaves_the_checkpoint_table_usable_and_says_what_to_grant(stack, aws, caplog):
    table = f"ckpt-{stack.table}"
    plan = FaultPlan(rate=0.0, rates={"dynamodb:UpdateTimeToLive": 1.0}, kinds=("access-denied",))
    with FaultProxy(aws.endpoint_url, plan) as proxy:
        clients = ProxiedClients(stack.settings(checkpoint_table=table, botocore_max_attempts=1), proxy.url)
        store = FirstFailures(clients.dynamodb, stack.settings(checkpoint_table=table), stack.table, "shardId-1")

        store.note("100", 1_000_000.0)
        recalled = store.recall()

    assert recalled == {"100": 1_000_000.0}  # the times are kept all the same
    described = stack.ddb.describe_time_to_live(TableName=table)["TimeToLiveDescription"]
    assert described["TimeToLiveStatus"] == "DISABLED"
    [warning] = [r for r in caplog.records if "TTL not enabled" in r.getMessage()]
    assert "dynamodb:UpdateTimeToLive" in warning.error
