"""The sweeper against moto over HTTP: expired sessions go in one sweep, live and refreshed ones stay, no Scan."""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pytest

from cleanup.application_contract import create_session, expiry_bucket, touch_session
from cleanup.aws.clients import Clients
from cleanup.expiry.sweeper import Verdict, sweep
from cleanup.runtime import Runtime
from cleanup.telemetry import Metrics, MetricsSink
from tests.stack import SessionStack
from tests.test_sessions import add_expiry_index, get
from worker import lambda_handler
from worker import sweep as sweep_entry


class CapturedMetrics(MetricsSink):
    """Keeps the EMF documents instead of writing them."""

    def __init__(self) -> None:
        super().__init__("off")
        self.documents: list[dict[str, Any]] = []

    def write(self, documents: Iterable[dict[str, Any]]) -> None:
        self.documents += list(documents)

    def values(self, name: str, **dimensions: str) -> list[Any]:
        found = []
        for doc in self.documents:
            if name in doc and all(doc.get(k) == v for k, v in dimensions.items()):
                value = doc[name]
                found += value if isinstance(value, list) else [value]
        return found


@pytest.fixture
def indexed(stack: SessionStack) -> SessionStack:
    add_expiry_index(stack)
    return stack


def runtime(stack: SessionStack, sink: MetricsSink | None = None, **overrides: Any) -> Runtime:
    overrides.setdefault("sweep_lookback_seconds", 7200)  # three hour buckets: the tests' sessions, fewer queries
    settings = stack.settings(**overrides)
    return Runtime(settings, Clients(settings), Metrics(settings, sink or MetricsSink("off")))


def operations(rt: Runtime) -> Counter[str]:
    """Every DynamoDB operation the runtime's client sends, counted by name."""
    seen: Counter[str] = Counter()

    def count(model: Any, **_: Any) -> None:
        seen[model.name] += 1

    rt.clients.dynamodb.meta.events.register("before-call.dynamodb", count)
    return seen


def session(stack: SessionStack, session_id: str, expires_in: int, **options: Any) -> None:
    create_session(
        stack.ddb,
        stack.table,
        session_id,
        tenant_id="t1",
        scratch_prefix=f"sessions/t1/{session_id}/",
        connection_id=f"conn-{session_id}",
        ttl_seconds=expires_in,
        **options,
    )


def test_one_sweep_deletes_every_expired_session_and_no_live_one(indexed: SessionStack) -> None:
    for n in range(5):
        session(indexed, f"old{n}", expires_in=-10 - 60 * n)
    for n in range(3):
        session(indexed, f"live{n}", expires_in=120 + n)  # same hour buckets as the expired ones
    sink = CapturedMetrics()

    report = sweep(runtime(indexed, sink))

    assert [get(indexed, f"old{n}") for n in range(5)] == [None] * 5
    assert all(get(indexed, f"live{n}") is not None for n in range(3))
    assert report.verdicts[Verdict.SWEPT] == 5 and report.ok
    assert sink.values("SessionsSwept") == [5]
    lags = sink.values("SweepLagSeconds")
    assert len(lags) == 5 and min(lags) >= 10


def test_a_session_refreshed_between_query_and_delete_is_kept(indexed: SessionStack) -> None:
    # The sweep's clock runs 15 minutes ahead of the application's: to it both sessions have expired, while the
    # application still sees them live (a touch never revives a session whose ttl has passed by its own clock).
    session(indexed, "busy", expires_in=600)
    session(indexed, "idle", expires_in=600)
    rt = runtime(indexed)

    def heartbeat(params: dict[str, Any], **_: Any) -> None:
        # Runs after the sweep's query read ttl, just before its DeleteItem is sent: the user came back.
        if params["Key"]["pk"]["S"] == "session#busy":
            assert touch_session(indexed.ddb, indexed.table, "busy", ttl_seconds=3600)

    rt.clients.dynamodb.meta.events.register("before-parameter-build.dynamodb.DeleteItem", heartbeat)
    report = sweep(rt, now=int(time.time()) + 900)

    busy = get(indexed, "busy")
    assert busy is not None and int(busy["ttl"]["N"]) > time.time() + 900
    assert get(indexed, "idle") is None
    assert (report.verdicts[Verdict.KEPT], report.verdicts[Verdict.SWEPT]) == (1, 1)


def test_a_session_deleted_between_query_and_delete_counts_as_gone(indexed: SessionStack) -> None:
    session(indexed, "ended", expires_in=-30)
    rt = runtime(indexed)

    def logout(params: dict[str, Any], **_: Any) -> None:
        indexed.ddb.delete_item(TableName=indexed.table, Key=params["Key"])

    rt.clients.dynamodb.meta.events.register("before-parameter-build.dynamodb.DeleteItem", logout)
    report = sweep(rt)

    assert report.verdicts[Verdict.GONE] == 1 and report.verdicts[Verdict.SWEPT] == 0


@pytest.mark.slow
def test_many_buckets_and_pages_are_swept_in_one_run(indexed: SessionStack) -> None:
    now = int(time.time())
    for n in range(250):  # 30 one-minute buckets, 8 or 9 sessions each
        session(indexed, f"s{n:03d}", expires_in=-5 - 60 * (n % 30), bucket_seconds=60, now=now)
    session(indexed, "live", expires_in=600, bucket_seconds=60, now=now)
    rt = runtime(indexed, expiry_bucket_seconds=60, sweep_lookback_seconds=40 * 60)
    calls = operations(rt)

    report = sweep(rt, page_size=3, now=now)

    assert report.verdicts[Verdict.SWEPT] == 250 and report.ok
    assert calls["DeleteItem"] == 250
    full_pages = 10 * 3 + 20 * 3  # ten buckets of 9 sessions and twenty of 8, in pages of 3
    assert calls["Query"] >= full_pages + 11  # and the 11 empty buckets of the 41 looked at
    remaining = indexed.ddb.scan(TableName=indexed.table, Select="COUNT")["Count"]  # the test may scan; the sweep not
    assert remaining == 1 and get(indexed, "live") is not None


def test_the_sweep_makes_no_scan_call(indexed: SessionStack) -> None:
    session(indexed, "old", expires_in=-30)
    rt = runtime(indexed)
    calls = operations(rt)

    sweep(rt)

    assert calls["Scan"] == 0
    assert set(calls) == {"Query", "DeleteItem"} and calls["DeleteItem"] == 1


def test_sharded_buckets_are_all_swept(indexed: SessionStack) -> None:
    for n in range(12):
        session(indexed, f"s{n}", expires_in=-30, shards=4)
    shards = {expiry_bucket(0, bucket_seconds=3600, shards=4, session_id=f"s{n}") for n in range(12)}

    report = sweep(runtime(indexed, expiry_shards=4))

    assert len(shards) > 1  # the sessions really are spread over several shards
    assert report.verdicts[Verdict.SWEPT] == 12
    assert all(get(indexed, f"s{n}") is None for n in range(12))


def test_dry_run_deletes_nothing_and_counts_what_it_would_delete(indexed: SessionStack) -> None:
    session(indexed, "old", expires_in=-30)

    report = sweep(runtime(indexed, cleanup_mode="dry-run"))

    assert report.verdicts[Verdict.PLANNED] == 1
    assert get(indexed, "old") is not None


def test_swept_sessions_are_cleaned_up_through_the_stream_with_reason_expired(indexed: SessionStack) -> None:
    past = int(time.time()) - 120
    bucket = {"expiryBucket": expiry_bucket(past, bucket_seconds=3600)}
    expired = [indexed.put_session(f"x{n}", ttl=past, extra=bucket) for n in range(2)]
    live = indexed.put_session(
        "live", ttl=past + 7200, extra={"expiryBucket": expiry_bucket(past + 7200, bucket_seconds=3600)}
    )
    sweep(runtime(indexed))
    sink = CapturedMetrics()
    with lambda_handler.warm.use(runtime(indexed, sink)):
        result = lambda_handler.handler(indexed.lambda_event(), None)

    assert result == {"batchItemFailures": []}
    for item in expired:
        assert indexed.objects(item["scratchPrefix"]) == []
        assert item["grantId"] not in indexed.grant_ids()
    assert len(indexed.objects(live["scratchPrefix"])) == 3 and live["grantId"] in indexed.grant_ids()
    assert sink.values("SessionsCleaned", Reason="expired") == [2]
    assert sink.values("SessionsCleaned", Reason="explicit") == []


def test_the_command_sweeps_the_table_and_exits_zero(
    indexed: SessionStack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    session(indexed, "old", expires_in=-30)
    monkeypatch.setenv("EXPIRY_INDEX", "expiry-index")

    parser = argparse.ArgumentParser()
    sweep_entry.add_arguments(parser)

    code = sweep_entry.main(parser.parse_args(["--table", indexed.table, "--page-size", "10"]))

    assert code == 0
    assert get(indexed, "old") is None
    assert '"swept": 1' in capsys.readouterr().out


def test_the_scheduled_handler_sweeps_and_returns_its_counts(indexed: SessionStack) -> None:
    session(indexed, "old", expires_in=-30)
    with sweep_entry.warm.use(runtime(indexed)):
        result = sweep_entry.handler({"source": "aws.scheduler"}, None)

    assert result["swept"] == 1 and result["failedBuckets"] == 0
    assert get(indexed, "old") is None


def test_items_that_are_not_sessions_by_their_key_are_never_swept(indexed: SessionStack) -> None:
    # A single table: an invitation, and another row of a session's partition, both carry a ttl past due and an
    # expiry bucket. Only the session row may go; the others are left to DynamoDB TTL, as the worker skips them.
    session(indexed, "old", expires_in=-30)
    item = indexed.ddb.get_item(TableName=indexed.table, Key=indexed.key("old"), ConsistentRead=True)["Item"]
    others = [{**item, "pk": {"S": "invite#x1"}}, {**item, "sk": {"S": "presence"}}]
    for other in others:
        indexed.ddb.put_item(TableName=indexed.table, Item=other)
    rt = runtime(indexed, session_key_prefix="session#", session_sort_key=item["sk"]["S"])

    report = sweep(rt)

    assert get(indexed, "old") is None and report.verdicts[Verdict.SWEPT] == 1
    for other in others:
        key = {name: other[name] for name in ("pk", "sk")}
        assert indexed.ddb.get_item(TableName=indexed.table, Key=key, ConsistentRead=True).get("Item") == other
