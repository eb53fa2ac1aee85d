"""The write-path helpers: what they store, and that the index, the sweeper and the worker can rely on it."""

from __future__ import annotations

from typing import Any

import pytest

from cleanup.application_contract import (
    create_session,
    end_session,
    expiry_bucket,
    expiry_buckets,
    live_session,
    session_key,
    touch_session,
)
from cleanup.core.classify import classify
from cleanup.exceptions import SessionExistsError
from schemas.outcomes import Reason
from schemas.records import read_lambda_event
from schemas.settings import AttributeNames
from tests.stack import SessionStack

INDEX = "expiry-index"
NOW = 1_700_000_000  # a fixed clock: 2023-11-14T22:13:20Z, 20 s into an hour bucket starting at 1_699_999_200


def add_expiry_index(stack: SessionStack, names: AttributeNames | None = None) -> None:
    """Give a test stack's table the sweeper's sparse index: partition key the expiry bucket, sort key ttl."""
    names = names or AttributeNames()
    stack.ddb.update_table(
        TableName=stack.table,
        AttributeDefinitions=[
            {"AttributeName": names.expiry_bucket, "AttributeType": "S"},
            {"AttributeName": names.ttl, "AttributeType": "N"},
        ],
        GlobalSecondaryIndexUpdates=[
            {
                "Create": {
                    "IndexName": INDEX,
                    "KeySchema": [
                        {"AttributeName": names.expiry_bucket, "KeyType": "HASH"},
                        {"AttributeName": names.ttl, "KeyType": "RANGE"},
                    ],
                    "Projection": {"ProjectionType": "KEYS_ONLY"},
                }
            }
        ],
    )


@pytest.fixture
def indexed(stack: SessionStack) -> SessionStack:
    add_expiry_index(stack)
    return stack


def get(stack: SessionStack, session_id: str) -> dict[str, Any] | None:
    item: dict[str, Any] | None = stack.ddb.get_item(
        TableName=stack.table, Key=session_key(session_id), ConsistentRead=True
    ).get("Item")
    return item


def in_bucket(stack: SessionStack, bucket: str) -> list[str]:
    items = stack.ddb.query(
        TableName=stack.table,
        IndexName=INDEX,
        KeyConditionExpression="expiryBucket = :b",
        ExpressionAttributeValues={":b": {"S": bucket}},
    )["Items"]
    return [item["pk"]["S"] for item in items]


def new_session(stack: SessionStack, session_id: str, **overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "tenant_id": "t1",
        "scratch_prefix": f"sessions/t1/{session_id}/",
        "connection_id": f"conn-{session_id}",
        "grant_id": f"grant-{session_id}",
        "ttl_seconds": 1800,
        "now": NOW,
    }
    values.update(overrides)
    return create_session(stack.ddb, stack.table, session_id, **values)


def test_create_stores_ttl_and_expiry_bucket_and_the_index_finds_it(indexed: SessionStack) -> None:
    item = new_session(indexed, "s1", kms_key_id="key-1")

    stored = get(indexed, "s1")
    assert stored is not None
    assert stored["ttl"] == {"N": str(NOW + 1800)}
    assert stored["expiryBucket"] == {"S": "1699999200"}
    assert stored["kmsKeyId"] == {"S": "key-1"}
    assert "callbackUrl" not in stored
    assert item["ttl"] == NOW + 1800
    assert in_bucket(indexed, "1699999200") == ["session#s1"]


def test_create_refuses_to_overwrite_a_live_session(indexed: SessionStack) -> None:
    new_session(indexed, "s1", grant_id="first-grant")

    with pytest.raises(SessionExistsError):
        new_session(indexed, "s1", grant_id="second-grant")

    stored = get(indexed, "s1")
    assert stored is not None and stored["grantId"] == {"S": "first-grant"}


def test_touch_moves_ttl_and_bucket_together(indexed: SessionStack) -> None:
    new_session(indexed, "s1", ttl_seconds=600)

    refreshed = touch_session(indexed.ddb, indexed.table, "s1", ttl_seconds=3600, now=NOW + 300)

    stored = get(indexed, "s1")
    assert refreshed is True
    assert stored is not None and stored["ttl"] == {"N": str(NOW + 300 + 3600)}
    assert in_bucket(indexed, "1699999200") == []
    assert in_bucket(indexed, "1700002800") == ["session#s1"]


def test_touch_does_not_resurrect_an_ended_session(indexed: SessionStack) -> None:
    new_session(indexed, "s1")
    end_session(indexed.ddb, indexed.table, "s1")

    refreshed = touch_session(indexed.ddb, indexed.table, "s1", ttl_seconds=3600, now=NOW)

    assert refreshed is False
    assert get(indexed, "s1") is None


def test_touch_does_not_revive_a_session_whose_ttl_has_passed(indexed: SessionStack) -> None:
    # TTL deletes days late: until then the expired item is still there, and a touch must not bring it back.
    new_session(indexed, "s1", ttl_seconds=600)

    refreshed = touch_session(indexed.ddb, indexed.table, "s1", ttl_seconds=3600, now=NOW + 601)

    stored = get(indexed, "s1")
    assert refreshed is False
    assert stored is not None and stored["ttl"] == {"N": str(NOW + 600)}
    assert in_bucket(indexed, "1699999200") == ["session#s1"]


def test_live_session_treats_an_item_past_its_ttl_as_gone(indexed: SessionStack) -> None:
    new_session(indexed, "expired", ttl_seconds=600)
    new_session(indexed, "live", ttl_seconds=3600)

    expired = live_session(indexed.ddb, indexed.table, "expired", now=NOW + 601)
    live = live_session(indexed.ddb, indexed.table, "live", now=NOW + 601)
    absent = live_session(indexed.ddb, indexed.table, "never", now=NOW)

    assert expired is None and absent is None
    assert live is not None and live["connectionId"] == {"S": "conn-live"} and live["ttl"] == {"N": str(NOW + 3600)}
    assert get(indexed, "expired") is not None  # only TTL or the sweeper deletes it: the read just ignores it


def test_end_deletes_the_item_and_the_stream_reports_an_explicit_delete(indexed: SessionStack) -> None:
    new_session(indexed, "s1", ttl_seconds=10**9)  # far in the future: the session had not expired

    ended = end_session(indexed.ddb, indexed.table, "s1")
    again = end_session(indexed.ddb, indexed.table, "s1")

    assert (ended, again) == (True, False)
    assert get(indexed, "s1") is None
    records = read_lambda_event(indexed.lambda_event())
    removes = [record for record in records if getattr(record, "event_name", None) == "REMOVE"]
    assert len(removes) == 1
    decision = classify(removes[0], indexed.settings())  # type: ignore[arg-type]
    assert decision.reason is Reason.EXPLICIT
    assert decision.session is not None and decision.session.grant_id == "grant-s1"


def test_custom_attribute_names_are_used_for_every_write(stack: SessionStack) -> None:
    names = AttributeNames(ttl="expiresAt", expiry_bucket="sweepBucket")
    add_expiry_index(stack, names)

    new_session(stack, "s1", names=names)
    touch_session(stack.ddb, stack.table, "s1", ttl_seconds=60, names=names, now=NOW)

    stored = get(stack, "s1")
    assert stored is not None
    assert stored["expiresAt"] == {"N": str(NOW + 60)} and stored["sweepBucket"] == {"S": "1699999200"}
    assert "ttl" not in stored and "expiryBucket" not in stored


def test_a_sharded_session_keeps_its_shard_and_the_sweep_range_covers_every_shard() -> None:
    first = expiry_bucket(NOW, bucket_seconds=3600, shards=4, session_id="s1")
    later = expiry_bucket(NOW + 7200, bucket_seconds=3600, shards=4, session_id="s1")

    start, shard = first.split("#")
    assert start == "1699999200" and 0 <= int(shard) < 4
    assert later == f"1700006400#{shard}"
    assert expiry_buckets(NOW - 3600, NOW, bucket_seconds=3600, shards=2) == [
        "1699995600#0",
        "1699995600#1",
        "1699999200#0",
        "1699999200#1",
    ]
    assert expiry_buckets(NOW - 3600, NOW, bucket_seconds=3600) == ["1699995600", "1699999200"]
