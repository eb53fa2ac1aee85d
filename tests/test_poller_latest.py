"""START_POSITION=LATEST keeps its place: a shard started at LATEST is pinned to a position the next process finds,
so a record read (or written) after the start is never skipped by a restart, a lease hand-over, a switch from dry
run to enforce, or an iterator that expired. Records older than the start stay unread, as LATEST means."""

from __future__ import annotations

import signal
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest

from cleanup.killswitch import Mode
from cleanup.streams.checkpoints import ensure_table
from tests.faults import Faults
from tests.proxy import FaultPlan, FaultProxy
from tests.test_poller import ROOT, FakeTime, assert_cleaned, checkpoint, make_poller, worker_command_env
from tests.waiting import wait_for
from worker.local.backend import DEFAULT_ACCOUNT_ID

LATEST = {"start_position": "LATEST", "botocore_max_attempts": 1}


def backdate(stack: Any, hours: int = 1) -> None:
    """Every record the stream holds now, written an hour ago (moto dates them at the write)."""
    from moto.dynamodb.models import dynamodb_backends

    shard = dynamodb_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].get_table(stack.table).stream_shard
    for item in shard.items:
        item.record["dynamodb"]["ApproximateCreationDateTime"] -= timedelta(hours=hours)


def before_the_start(stack: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A session deleted an hour before the poller starts (LATEST leaves it), and one created then, deleted later."""
    old, new = stack.put_session("old"), stack.put_session("new")
    stack.delete("old")
    backdate(stack)
    return old, new


def assert_left(stack: Any, item: dict[str, Any]) -> None:
    assert len(stack.objects(item["scratchPrefix"])) == 3
    assert item["grantId"] in stack.grant_ids()


def failing_grants(poller: Any) -> None:
    Faults(poller.runtime.clients.kms, "RetireGrant", "KMSInternalException", status=500, times=10**9)


def test_a_latest_start_that_read_nothing_keeps_its_place_across_a_restart(stack):
    old, new = before_the_start(stack)
    first = make_poller(stack, **LATEST).run(until_idle=True)
    stack.delete("new")

    resumed = make_poller(stack, **LATEST).run(until_idle=True)

    assert first.records == 0
    assert (resumed.records, resumed.cleaned) == (1, 1)
    assert_cleaned(stack, new)
    assert_left(stack, old)


def release_the_lease(stack: Any) -> None:
    """Another consumer's view: the lease was handed over (released, then taken by the next poller)."""
    stack.ddb.update_item(
        TableName=f"ckpt-{stack.table}",
        Key={"stream": {"S": stack.stream_arn}, "shard": {"S": "#lease"}},
        UpdateExpression="SET #o = :nobody, version = version + :one",
        ExpressionAttributeNames={"#o": "owner"},
        ExpressionAttributeValues={":nobody": {"S": ""}, ":one": {"N": "1"}},
    )


@pytest.mark.parametrize("moment", ["stop", "lease-handover"])
def test_the_first_record_read_at_a_latest_start_is_read_again_by_the_next_poller(stack, moment):
    old, new = before_the_start(stack)
    fake = FakeTime()
    poller: Any = None

    def write_once() -> None:
        if len(fake.on_sleep) == 1:  # the first empty read at LATEST is behind: the record comes after the start
            fake.on_sleep.append(lambda: None)
            stack.delete("new")

    def after_the_first_attempt(_shard: str, _outcomes: list[Any]) -> None:
        if moment == "stop":
            poller.request_stop()  # what SIGTERM does
        else:
            release_the_lease(stack)
            poller.request_stop()

    fake.on_sleep.append(write_once)
    poller = make_poller(stack, fake, hook=after_the_first_attempt, **LATEST)
    failing_grants(poller)
    first = poller.run()

    resumed = make_poller(stack, **LATEST).run(until_idle=True)

    assert (first.records, first.failed, first.cleaned) == (1, 1, 0)
    assert (resumed.records, resumed.cleaned) == (1, 1)
    assert_cleaned(stack, new)
    assert_left(stack, old)


class Switch:
    """The kill switch, turned by the test."""

    def __init__(self, mode: Mode) -> None:
        self.now = mode
        self.environment = Mode.ENFORCE

    def mode(self) -> Mode:
        return self.now


def test_a_record_planned_in_dry_run_at_a_latest_start_is_cleaned_once_enforce_is_back(stack):
    old, new = before_the_start(stack)
    fake = FakeTime()
    poller = make_poller(stack, fake, **LATEST)
    switch = Switch(Mode.DRY_RUN)
    poller.runtime.switch = switch  # type: ignore[assignment]
    sleeps: list[float] = []

    def script() -> None:
        sleeps.append(fake.now)
        if len(sleeps) == 1:
            stack.delete("new")
        elif poller.summary.planned == 1 and switch.now is Mode.DRY_RUN:
            switch.now = Mode.ENFORCE
        elif poller.summary.cleaned or len(sleeps) > 40:
            poller.request_stop()

    fake.on_sleep.append(script)
    summary = poller.run()

    assert (summary.planned, summary.cleaned) == (1, 1)
    assert_cleaned(stack, new)
    assert_left(stack, old)


def test_an_iterator_that_expires_before_the_first_record_at_a_latest_start_loses_nothing(stack):
    old, new = before_the_start(stack)
    fake = FakeTime()
    poller = make_poller(stack, fake, **LATEST)
    sleeps: list[float] = []

    def script() -> None:
        sleeps.append(fake.now)
        if len(sleeps) == 1:  # a pause of 15 minutes: the record comes, and the iterator expires
            stack.delete("new")
            Faults(poller.runtime.clients.streams, "GetRecords", "ExpiredIteratorException", times=1)
        elif poller.summary.cleaned or len(sleeps) > 40:
            poller.request_stop()

    fake.on_sleep.append(script)
    summary = poller.run()

    assert (summary.records, summary.cleaned) == (1, 1)
    assert_cleaned(stack, new)
    assert_left(stack, old)


def pin_of(stack: Any) -> dict[str, Any]:
    """The checkpoint item of the stream's one shard ({} before there is one)."""
    try:
        return checkpoint(stack) or {}
    except stack.ddb.exceptions.ResourceNotFoundException:
        return {}


@pytest.mark.slow  # two processes of the real command
def test_a_record_retried_when_the_command_is_stopped_at_a_latest_start_is_cleaned_by_the_next(stack, aws, tmp_path):
    old, new = before_the_start(stack)
    plan = FaultPlan(rate=0.0, rates={"kms:RetireGrant": 1.0}, kinds=("throttle",))
    command = [sys.executable, "-m", "worker.cli", "run", "--table-name", stack.table]
    log = tmp_path / "first.log"
    with FaultProxy(aws.endpoint_url, plan) as proxy, log.open("w") as stderr:
        env = worker_command_env(stack, aws, proxy.url, START_POSITION="LATEST", POLL_INTERVAL_SECONDS="0.1")
        first = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            wait_for(lambda: "since" in pin_of(stack), "the LATEST start's pin", alive=first, log=log)
            stack.delete("new")
            wait_for(lambda: plan.by_call[("kms", "RetireGrant", "throttle")] > 0, "a first try", alive=first, log=log)
            first.send_signal(signal.SIGTERM)
            stopped = first.wait(timeout=60)
        finally:
            first.kill()

    env = worker_command_env(stack, aws, aws.endpoint_url, START_POSITION="LATEST")
    resumed = subprocess.run([*command, "--until-idle"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)

    assert stopped == 0, log.read_text()[-2000:]
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_cleaned(stack, new)
    assert_left(stack, old)


def test_the_enforce_run_after_a_dry_run_at_latest_cleans_what_the_dry_run_planned(stack):
    old, new = before_the_start(stack)
    ensure_table(stack.runtime().clients.dynamodb, f"ckpt-{stack.table}")  # an enforce consumer ran before
    make_poller(stack, **LATEST, cleanup_mode="dry-run").run(until_idle=True)  # the preview starts at LATEST
    stack.delete("new")

    preview = make_poller(stack, **LATEST, cleanup_mode="dry-run").run(until_idle=True)  # a later look at it
    enforced = make_poller(stack, **LATEST).run(until_idle=True)

    assert (preview.planned, preview.cleaned) == (1, 0)
    assert enforced.cleaned == 1
    assert_cleaned(stack, new)
    assert_left(stack, old)  # deleted before the dry run started: LATEST leaves it


def test_a_dry_run_at_latest_without_a_checkpoint_table_says_the_enforce_run_will_not_see_its_records(stack, caplog):
    make_poller(stack, **LATEST, cleanup_mode="dry-run").run(until_idle=True)

    [warning] = [r for r in caplog.records if "keeps no place" in r.getMessage()]
    assert warning.levelname == "WARNING" and "TRIM_HORIZON" in warning.getMessage()
