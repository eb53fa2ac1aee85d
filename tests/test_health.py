"""Container health: ``cleanup-worker health`` for the poller and the KCL image, and the lease of a wedged poller."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest

from cleanup.streams.checkpoints import ensure_table
from cleanup.streams.lease import Heartbeat, Lease
from cleanup.streams.poller import StreamPoller
from cleanup.streams.stream_state import StreamState
from tests.kcl_daemon import FakeDaemon, KinesisShard, kinesis_payload
from tests.proxy import FaultPlan, FaultProxy
from tests.stack import table_exists
from tests.waiting import WAIT_GUARD_SECONDS, wait_for
from worker import cli
from worker import health as health_command
from worker.health import DAEMON_CLASS
from worker.local.appconfig import LocalAgent, flag

ROOT = Path(__file__).resolve().parent.parent


def health(health_file: Path, *args: str, stale_seconds: str = "5") -> subprocess.CompletedProcess[str]:
    """``cleanup-worker health`` as the HEALTHCHECK runs it: a command of its own, settings from the environment."""
    env = {**os.environ, "HEALTH_FILE": str(health_file), "HEALTH_STALE_SECONDS": stale_seconds}
    command = [sys.executable, "-m", "worker.cli", "health", *args]
    return subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)


def aged(path: Path, seconds: float) -> None:
    """Make ``path`` look last touched ``seconds`` ago."""
    then = time.time() - seconds
    os.utime(path, (then, then))


# The poller's health file.
def test_a_poller_file_touched_within_the_bound_is_healthy(tmp_path, monkeypatch, capsys):
    health_file = tmp_path / "health"
    health_file.touch()
    monkeypatch.setenv("HEALTH_FILE", str(health_file))
    monkeypatch.setenv("HEALTH_STALE_SECONDS", "5")

    code = cli.main(["health"])

    assert (code, capsys.readouterr().out) == (0, "healthy\n")


def test_a_poller_file_older_than_the_bound_is_unhealthy(tmp_path, monkeypatch, capsys):
    health_file = tmp_path / "health"
    health_file.touch()
    aged(health_file, 10)
    monkeypatch.setenv("HEALTH_FILE", str(health_file))
    monkeypatch.setenv("HEALTH_STALE_SECONDS", "5")

    code = cli.main(["health"])

    assert code == 1
    # The age printed is 10 s, or more on a loaded machine.
    assert capsys.readouterr().out.startswith("unhealthy: the poll loop last came round ")


def test_no_poller_file_is_unhealthy_and_the_bound_defaults_to_three_lease_terms(tmp_path, monkeypatch, capsys):
    health_file = tmp_path / "health"
    monkeypatch.setenv("HEALTH_FILE", str(health_file))
    monkeypatch.setenv("LEASE_SECONDS", "2")
    missing = cli.main(["health"])
    health_file.touch()
    aged(health_file, 7)

    stale = cli.main(["health"])

    assert (missing, stale) == (1, 1)
    assert "HEALTH_STALE_SECONDS: 6" in capsys.readouterr().out


def test_a_live_poller_whose_stream_has_ended_is_unhealthy_with_the_reason(tmp_path, monkeypatch, capsys):
    health_file = tmp_path / "health"
    health_file.touch()  # the loop is alive...
    reason = "stream arn:aws:dynamodb:us-east-1:1:table/t/stream/x no longer exists, and table t names no other stream"
    StreamState(str(health_file)).problem(reason)  # ...but its stream is gone
    monkeypatch.setenv("HEALTH_FILE", str(health_file))

    code = cli.main(["health"])

    assert code == 1
    assert capsys.readouterr().out.strip() == f"unhealthy: {reason}"


def test_invalid_settings_are_unhealthy_with_exit_1_not_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HEALTH_FILE", str(tmp_path / "health"))
    monkeypatch.setenv("HEALTH_STALE_SECONDS", "-1")

    code = cli.main(["health"])

    assert code == 1  # Docker reserves 2
    assert "HEALTH_STALE_SECONDS" in capsys.readouterr().out


def test_the_poller_keeps_its_health_file_while_it_runs_and_removes_it_when_it_stops(stack, tmp_path):
    stack.put_session("a")
    stack.delete("a")
    health_file = tmp_path / "health"
    seen: list[bool] = []
    runtime = stack.runtime(checkpoint_table=f"ckpt-{stack.table}", health_file=str(health_file))
    poller = StreamPoller(
        runtime, stack.stream_arn, before_checkpoint=lambda _shard, _outcomes: seen.append(health_file.exists())
    )

    summary = poller.run(until_idle=True)

    assert summary.cleaned == 1 and seen == [True]
    assert not health_file.exists()


# The lease follows the loop.
class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lease_version(stack: Any) -> int:
    key = {"stream": {"S": stack.stream_arn}, "shard": {"S": "#lease"}}
    item = stack.ddb.get_item(TableName=f"ckpt-{stack.table}", Key=key, ConsistentRead=True)["Item"]
    return int(item["version"]["N"])


@pytest.mark.parametrize(("loop_alive", "renewed"), [(True, True), (False, False)])
def test_the_heartbeat_renews_the_lease_only_while_the_loop_comes_round(stack, loop_alive, renewed):
    runtime = stack.runtime()
    ensure_table(runtime.clients.dynamodb, f"ckpt-{stack.table}")
    clock = FakeClock()
    lease = Lease(runtime.clients.dynamodb, f"ckpt-{stack.table}", stack.stream_arn, "me", 10, clock)
    assert lease.try_acquire()
    before = lease_version(stack)
    clock.now += 5  # past a third of the term: a renewal is due

    Heartbeat(lease, alive=lambda: loop_alive).tick()

    assert (lease_version(stack) > before) is renewed


# A wedged poller.
WEDGE_SETTINGS = {"lease_seconds": 2.0, "health_stale_seconds": 1.0, "poll_interval_seconds": 0.1}


class HeldReads:
    """Holds every GetRecords of one client until released: a call that does not come back."""

    def __init__(self, client: Any) -> None:
        self.release = threading.Event()
        self.holding = threading.Event()
        service = client.meta.service_model.service_id.hyphenize()
        client.meta.events.register(f"before-send.{service}.GetRecords", self._hold)

    def _hold(self, **_: Any) -> None:
        self.holding.set()
        self.release.wait(WAIT_GUARD_SECONDS)  # bounded: a failing test still ends


def start(poller: StreamPoller) -> threading.Thread:
    thread = threading.Thread(target=poller.run, name=poller.consumer_id, daemon=True)
    thread.start()
    return thread


def lease_owner(stack: Any) -> str | None:
    key = {"stream": {"S": stack.stream_arn}, "shard": {"S": "#lease"}}
    if not table_exists(stack.ddb, f"ckpt-{stack.table}"):
        return None
    item = stack.ddb.get_item(TableName=f"ckpt-{stack.table}", Key=key, ConsistentRead=True).get("Item")
    return item["owner"]["S"] if item else None


def test_the_lease_owner_is_read_when_the_server_holds_more_tables_than_one_listing_page(stack):
    # The run's one server gathers every stack's tables: the checkpoint table may come past the first 100 names.
    fillers = [f"filler-{uuid.uuid4().hex[:10]}" for _ in range(101)]
    for name in fillers:
        stack.ddb.create_table(
            TableName=name,
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            BillingMode="PAY_PER_REQUEST",
        )
    try:
        runtime = stack.runtime()
        ensure_table(runtime.clients.dynamodb, f"ckpt-{stack.table}")
        lease = Lease(runtime.clients.dynamodb, f"ckpt-{stack.table}", stack.stream_arn, "me", 10, FakeClock())
        assert lease.try_acquire()

        owner = lease_owner(stack)
    finally:
        for name in fillers:
            stack.ddb.delete_table(TableName=name)

    assert owner == lease.owner


@pytest.mark.slow  # two pollers, a lease term to lapse
def test_a_wedged_poller_loses_its_lease_to_the_standby_fails_its_health_check_and_then_acts_on_nothing(
    stack, tmp_path
):
    item = stack.put_session("a")
    stack.delete("a")
    files = {name: tmp_path / name for name in ("wedged", "standby")}
    runtimes = {
        name: stack.runtime(checkpoint_table=f"ckpt-{stack.table}", health_file=str(path), **WEDGE_SETTINGS)
        for name, path in files.items()
    }
    held = HeldReads(runtimes["wedged"].clients.streams)
    wedged = StreamPoller(runtimes["wedged"], stack.stream_arn, consumer_id="wedged")
    standby = StreamPoller(runtimes["standby"], stack.stream_arn, consumer_id="standby")
    threads = [start(wedged)]
    try:
        wait_for(
            lambda: held.holding.is_set() and lease_owner(stack) == wedged.lease.owner, "the first poller's held read"
        )
        threads.append(start(standby))

        # The standby takes over LEASE_SECONDS after the last renewal, which stopped with the loop: it cleans.
        wait_for(lambda: lease_owner(stack) == standby.lease.owner, "the standby's takeover", limit=30)
        wait_for(lambda: stack.objects(item["scratchPrefix"]) == [], "the standby's cleaning")
        checks = {name: health(path, stale_seconds="1") for name, path in files.items()}

        held.release.set()  # the wedged read returns its page: the poller finds the lease gone and stops there
        wait_for(lambda: wedged.summary.lease_lost, "the wedged poller to notice its lost lease")
    finally:
        held.release.set()
        for poller in (wedged, standby):
            poller.request_stop()
        for thread in threads:
            thread.join(WAIT_GUARD_SECONDS)

    assert (checks["wedged"].returncode, checks["standby"].returncode) == (1, 0), checks
    assert "the poll loop last came round" in checks["wedged"].stdout
    assert item["grantId"] not in stack.grant_ids()
    assert standby.summary.cleaned == 1
    assert wedged.summary.records == 2  # the held page did come back...
    assert (wedged.summary.cleaned, wedged.summary.skipped, wedged.summary.failed) == (
        0,
        0,
        0,
    )  # ...and was not acted on


# The KCL image.
def idle_process(*args: str) -> subprocess.Popen[bytes]:
    """A process whose command line names ``args`` (a stand-in for the java daemon)."""
    command = [sys.executable, "-c", "import sys; sys.stdin.read()", *args]
    return subprocess.Popen(command, stdin=subprocess.PIPE)


@pytest.fixture
def fake_daemon_process():
    process = idle_process(DAEMON_CLASS)
    yield process
    process.kill()
    process.wait()


def test_kcl_health_fails_when_no_multilang_daemon_runs(tmp_path):
    other = idle_process("something-else")
    try:
        result = health(tmp_path / "health", "--kcl", "--daemon-pid", str(other.pid))
    finally:
        other.kill()
        other.wait()

    assert result.returncode == 1
    assert "MultiLangDaemon is not running" in result.stdout


def test_kcl_health_fails_while_a_processor_holds_a_message_past_the_bound_and_recovers_once_it_answers(
    stack, aws, tmp_path, fake_daemon_process
):
    stack.put_session("a")
    stack.delete("a")
    records = KinesisShard().records(kinesis_payload(record, stack.table) for record in stack.new_records())
    health_file = tmp_path / "health"
    env = {
        **aws.environment(),
        "SCRATCH_BUCKET": stack.bucket,
        "KMS_KEY_ID": stack.key_arn,
        "SESSION_TABLE": stack.table,
        "HEALTH_FILE": str(health_file),
    }
    child = FakeDaemon(env, tmp_path / "stderr.log")
    try:
        child.initialize()
        pid = str(fake_daemon_process.pid)
        idle = health(health_file, "--kcl", "--daemon-pid", pid, stale_seconds="1")
        child.post({"action": "processRecords", "records": records, "millisBehindLatest": 0})
        request = child.next_message()  # the checkpoint, left unanswered: the processor waits on it
        wait_for(
            lambda: health(health_file, "--kcl", "--daemon-pid", pid, stale_seconds="1").returncode == 1,
            "the held message to fail the check",
        )
        child.answer_checkpoint(request)
        child.await_status("processRecords")

        answered = health(health_file, "--kcl", "--daemon-pid", pid, stale_seconds="1")
        assert child.close() == 0
    finally:
        if child.child.poll() is None:
            child.kill()

    assert request["action"] == "checkpoint"
    assert (idle.returncode, answered.returncode) == (0, 0), (idle.stdout, answered.stdout)


@pytest.mark.parametrize(("dockerfile", "kcl"), [("Dockerfile", False), ("Dockerfile.kcl", True)])
def test_each_image_declares_a_healthcheck_running_the_health_command(dockerfile, kcl):
    lines = (ROOT / "deploy" / "container" / dockerfile).read_text().splitlines()
    healthchecks = [line for line in lines if line.startswith("HEALTHCHECK ")]
    assert len(healthchecks) == 1
    command = json.loads(healthchecks[0].split(" CMD ", 1)[1])

    args = cli.build_parser("health").parse_args(command[1:])

    assert command[0] == "cleanup-worker"
    assert (args.handler, args.kcl) == (health_command.main, kcl)


# The KCL processor's states: progressing and paused are healthy, stuck is not.
RETRY_METRIC = '"RecordsRetried":'
SCALED = {  # an hour-long bound scaled down: the check's bound 1.5 s, an attempt at most 1 s
    "HEALTH_STALE_SECONDS": "1.5",
    "SHUTDOWN_GRACE_SECONDS": "1",
    "RETRY_MAX_WAIT_SECONDS": "0.05",
    "BOTOCORE_MAX_ATTEMPTS": "1",
    "RETRY_ATTEMPTS": "1",
}
HELD_PAST_THE_BOUND = 8  # attempts whose backoffs (0.0125 s, doubling) add up to more than 1.5 s


@pytest.fixture
def throttled_kms(aws):
    """An endpoint throttling every RetireGrant: a session with a grant keeps failing transiently."""
    plan = FaultPlan(rate=0.0, rates={"kms:RetireGrant": 1.0}, kinds=("throttle",))
    with FaultProxy(aws.endpoint_url, plan) as proxy:
        yield proxy.url


@pytest.fixture
def kcl_child(aws, stack, tmp_path):
    """Start ``cleanup-worker kcl`` children on the stack (HEALTH_FILE in tmp_path); each is stopped after the test."""
    started: list[FakeDaemon] = []

    def start(**settings: str) -> FakeDaemon:
        env = {
            **aws.environment(),
            "SCRATCH_BUCKET": stack.bucket,
            "KMS_KEY_ID": stack.key_arn,
            "SESSION_TABLE": stack.table,
            "HEALTH_FILE": str(tmp_path / "health"),
            **SCALED,
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


def removal(stack: Any, session: str) -> list[dict[str, Any]]:
    """The REMOVE record of a new session, alone (its INSERT is read and left out)."""
    stack.put_session(session)
    stack.new_records()
    stack.delete(session)
    return KinesisShard().records(kinesis_payload(record, stack.table) for record in stack.new_records())


def kcl_health(tmp_path: Path, daemon_process: subprocess.Popen[bytes]) -> subprocess.CompletedProcess[str]:
    pid = str(daemon_process.pid)
    return health(tmp_path / "health", "--kcl", "--daemon-pid", pid, stale_seconds=SCALED["HEALTH_STALE_SECONDS"])


def test_kcl_health_holds_a_processor_retrying_towards_its_give_up_moment_healthy(
    stack, tmp_path, kcl_child, throttled_kms, fake_daemon_process
):
    queue = boto3.client("sqs", region_name="us-east-1").create_queue(QueueName=f"dlq-{uuid.uuid4().hex[:8]}")
    records = removal(stack, "throttled")
    child = kcl_child(
        AWS_ENDPOINT_URL=throttled_kms, DEAD_LETTER_QUEUE_URL=queue["QueueUrl"], MAX_RECORD_RETRY_SECONDS="600"
    )

    child.post({"action": "processRecords", "records": records, "millisBehindLatest": 0})
    wait_for(lambda: child.stderr().count(RETRY_METRIC) >= HELD_PAST_THE_BOUND, "retries past the check's bound")
    answer = kcl_health(tmp_path, fake_daemon_process)

    assert answer.returncode == 0, answer.stdout
    assert "retrying 1 record(s), given up in" in answer.stdout
    assert child.requests == []  # held: no checkpoint passed the record


def test_kcl_health_holds_a_processor_paused_by_the_kill_switch_healthy(
    stack, tmp_path, kcl_child, fake_daemon_process
):
    records = removal(stack, "paused")
    with LocalAgent() as agent:
        agent.serve(flag(False))
        child = kcl_child(**agent.env())
        child.post({"action": "processRecords", "records": records, "millisBehindLatest": 0})
        wait_for(lambda: agent.requests >= 8, "the processor to keep reading the paused switch")
        answer = kcl_health(tmp_path, fake_daemon_process)

    assert answer.returncode == 0, answer.stdout
    assert "paused by the kill switch" in answer.stdout
    assert child.requests == []


def test_kcl_health_fails_a_processor_stuck_on_a_record_no_queue_takes(
    stack, tmp_path, kcl_child, throttled_kms, fake_daemon_process
):
    records = removal(stack, "stuck")
    child = kcl_child(AWS_ENDPOINT_URL=throttled_kms, MAX_RECORD_RETRY_SECONDS="0.2")

    child.post({"action": "processRecords", "records": records, "millisBehindLatest": 0})
    wait_for(lambda: '"RecordsStuck"' in child.stderr(), "the record to be reported stuck")
    answer = kcl_health(tmp_path, fake_daemon_process)

    assert answer.returncode == 1
    assert f"is stuck on {records[0]['sequenceNumber']}" in answer.stdout


def test_kcl_refuses_to_start_when_one_attempt_may_outlast_the_health_bound(tmp_path, stack, aws):
    env = {**os.environ, **aws.environment(), "SESSION_TABLE": stack.table, "SCRATCH_BUCKET": stack.bucket}
    env.update(HEALTH_STALE_SECONDS="10", SHUTDOWN_GRACE_SECONDS="20", HEALTH_FILE=str(tmp_path / "health"))
    command = [sys.executable, "-m", "worker.cli", "kcl"]

    result = subprocess.run(command, env=env, cwd=ROOT, input="", capture_output=True, text=True, timeout=60)

    assert result.returncode == 2
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert "HEALTH_STALE_SECONDS" in line and "SHUTDOWN_GRACE_SECONDS" in line
