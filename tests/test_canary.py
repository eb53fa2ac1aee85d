"""The end-to-end canary: a session created through the write path and ended, timed until the worker has freed it;
``CanaryNotCleaned`` when it has not, in time. Against moto over HTTP, with the stream poller as the worker."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from cleanup.operations.canary import run_canary
from cleanup.streams.poller import StreamPoller
from schemas.convention import CANARY_TENANT
from tests.test_sweep import CapturedMetrics
from tests.waiting import WAIT_GUARD_SECONDS
from worker import cli

WORKER_ROLE = "arn:aws:iam::123456789012:role/session-cleanup"


@pytest.fixture
def worker(stack: Any) -> Iterator[CapturedMetrics]:
    """The stream poller, running on the stack's stream in a thread of its own; its metrics."""
    sink = CapturedMetrics()
    runtime = stack.runtime(checkpoint_table=f"ckpt-{stack.table}", poll_interval_seconds=0.1)
    runtime.metrics.sink = sink
    poller = StreamPoller(runtime, stack.stream_arn)
    thread = threading.Thread(target=poller.run, daemon=True)
    thread.start()
    yield sink
    poller.request_stop()
    thread.join(WAIT_GUARD_SECONDS)


def canary_runtime(stack: Any, sink: CapturedMetrics, **settings: Any) -> Any:
    runtime = stack.runtime(canary_grant_principal=WORKER_ROLE, **settings)
    runtime.metrics.sink = sink
    return runtime


def test_the_canary_times_the_worker_freeing_its_session_and_the_worker_counts_it_apart(stack, worker):
    sink = CapturedMetrics()

    report = run_canary(canary_runtime(stack, sink), timeout=WAIT_GUARD_SECONDS)

    assert report.cleaned and report.left == []
    assert stack.objects(f"sessions/{report.session_id}/") == []
    assert stack.grant_ids() == set()  # its grant, retired by the worker
    [latency] = sink.values("CanaryLatencySeconds")
    assert latency == report.seconds and sink.values("CanaryNotCleaned") == []
    assert worker.values("CanarySessionsCleaned") == [1]
    assert worker.values("SessionsCleaned") == []  # dashboards and counts leave the canary out
    assert stack.ddb.get_item(TableName=stack.table, Key=stack.key(report.session_id)).get("Item") is None


def test_a_canary_no_worker_frees_is_reported_not_cleaned_with_what_is_left(stack, caplog):
    sink = CapturedMetrics()

    report = run_canary(canary_runtime(stack, sink), timeout=2)

    assert not report.cleaned and report.left == ["scratch", "grant"]
    assert sink.values("CanaryNotCleaned") == [1] and sink.values("CanaryLatencySeconds") == []
    [error] = [r for r in caplog.records if r.getMessage().startswith("canary not cleaned within 2 s")]
    assert error.levelname == "ERROR"
    [grant] = stack.kms.list_grants(KeyId=stack.key_arn)["Grants"]
    assert grant["Name"] == f"session:{report.session_id}" and grant["Operations"] == ["DescribeKey"]


def test_the_canary_marks_its_session_and_holds_to_the_tenant_layout(stack):
    runtime = canary_runtime(stack, CapturedMetrics(), scratch_tenant_scoped=True)

    report = run_canary(runtime, timeout=0)

    assert stack.objects(f"sessions/{CANARY_TENANT}/{report.session_id}/") == [
        f"sessions/{CANARY_TENANT}/{report.session_id}/canary"
    ]
    [record] = [r for r in stack.new_records() if r["eventName"] == "INSERT"]
    assert record["dynamodb"]["NewImage"]["tenantId"] == {"S": CANARY_TENANT}


def test_the_canary_command_exits_0_once_the_worker_has_freed_it(worker_env, worker, monkeypatch, capsys):
    monkeypatch.setenv("CANARY_GRANT_PRINCIPAL", WORKER_ROLE)
    monkeypatch.setenv("CANARY_TIMEOUT_SECONDS", str(WAIT_GUARD_SECONDS))

    code = cli.main(["canary", "--json"])

    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["cleaned"] is True and report["left"] == []


def test_the_canary_does_not_run_under_a_dry_run(worker_env, monkeypatch, capsys):
    monkeypatch.setenv("CLEANUP_MODE", "dry-run")

    code = cli.main(["canary"])

    assert code == 0 and "canary not run: dry-run" in capsys.readouterr().out
    assert worker_env.objects() == []
