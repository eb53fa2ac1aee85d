"""Two stream pollers started with the same ``--consumer-id`` (a copied manifest): one consumes, the other stands by,
and no checkpoint ever moves backwards."""

from __future__ import annotations

import signal
import subprocess
import sys
from typing import Any

import pytest

from cleanup.exceptions import LeaseLostError
from cleanup.streams.checkpoints import Checkpoint, CheckpointStore, ensure_table
from cleanup.streams.lease import Lease
from cleanup.streams.poller import StreamPoller
from tests.proxy import FaultPlan, FaultProxy
from tests.scenarios.helpers import ProxiedClients
from tests.test_health import FakeClock
from tests.test_poller import ROOT, FakeTime, assert_cleaned, checkpoint, sequence_numbers, worker_command_env
from tests.waiting import wait_for


def replica(stack: Any, fake: FakeTime | None = None) -> StreamPoller:
    """A poller named ``replica``, as every copy of one manifest would be."""
    fake = fake or FakeTime()
    runtime = stack.runtime(checkpoint_table=f"ckpt-{stack.table}", lease_seconds=10)
    return StreamPoller(runtime, stack.stream_arn, consumer_id="replica", clock=fake.clock, sleep=fake.sleep)


def test_a_second_poller_with_the_same_consumer_id_stands_by_while_the_first_holds_the_lease(stack):
    item = stack.put_session("a")
    stack.delete("a")
    first = replica(stack)
    ensure_table(stack.ddb, f"ckpt-{stack.table}")
    assert first.lease.try_acquire()
    fake = FakeTime()
    second = replica(stack, fake)
    read_while_held: list[int] = []

    def first_renews_for_30_seconds() -> None:
        if fake.now < 1030:
            assert first.lease.renew()
            read_while_held.append(second.summary.records)

    fake.on_sleep.append(first_renews_for_30_seconds)
    summary = second.run(until_idle=True)

    assert len(read_while_held) > 4 and set(read_while_held) == {0}
    assert summary.records == 2  # once the first stopped renewing
    assert_cleaned(stack, item)
    assert not first.lease.renew()
    assert first.lease.owner.startswith("replica") and second.lease.owner.startswith("replica")


def test_a_checkpoint_is_never_moved_backwards(stack):
    for n in range(3):
        stack.put_session(f"s{n}")
    numbers = sequence_numbers(stack)
    table = f"ckpt-{stack.table}"
    ensure_table(stack.ddb, table)
    holder = Lease(stack.ddb, table, stack.stream_arn, "holder", 10.0)
    assert holder.try_acquire()
    store = CheckpointStore(stack.ddb, table, stack.stream_arn, holder)
    store.save("shard-1", Checkpoint(numbers[2]))

    with pytest.raises(LeaseLostError):
        store.save("shard-1", Checkpoint(numbers[0]))

    assert checkpoint_of(stack, "shard-1")["sequenceNumber"]["S"] == numbers[2]


def checkpoint_of(stack: Any, shard: str) -> dict[str, Any]:
    return checkpoint(stack, shard)  # type: ignore[return-value]


def lease_item(stack: Any) -> dict[str, Any]:
    try:
        return checkpoint(stack, "#lease") or {}
    except stack.ddb.exceptions.ResourceNotFoundException:
        return {}


@pytest.mark.slow  # two processes of the real command
def test_two_run_commands_with_the_same_consumer_id_never_both_hold_the_lease(stack, aws, tmp_path):
    env = worker_command_env(stack, aws, aws.endpoint_url, POLL_INTERVAL_SECONDS="0.1", LEASE_SECONDS="5")
    command = [sys.executable, "-m", "worker.cli", "run", "--table-name", stack.table, "--consumer-id", "replica"]
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for log in logs:
            with log.open("w") as stderr:
                processes.append(subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr))
            wait_for(lambda: lease_item(stack).get("owner", {}).get("S"), "a lease holder", alive=processes[0])
        first_owner = lease_item(stack)["owner"]["S"]
        wait_for(
            lambda: "standing by" in logs[1].read_text(), "the second to stand by", alive=processes[1], log=logs[1]
        )
        owner_while_both_run = lease_item(stack)["owner"]["S"]
    finally:
        for process in reversed(processes):  # the standby first: it must not take the lease the first releases
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)

    holding = [log.read_text().count('"holding the stream lease"') for log in logs]
    assert owner_while_both_run == first_owner and first_owner.startswith("replica:")
    assert holding[0] == 1 and holding[1] == 0, holding


def test_a_renewal_applied_whose_answer_was_lost_keeps_the_lease(stack, aws):
    # The service wrote the renewal, but its answer came after the read timeout: the lease is still this holder's,
    # at a version it did not see. The next renewal must not take that for a take-over.
    table = f"ckpt-{stack.table}"
    ensure_table(stack.ddb, table)
    plan = FaultPlan(rate=0.0, kinds=("delay",), delay_seconds=2.0)
    with FaultProxy(aws.endpoint_url, plan) as proxy:
        settings = stack.settings(checkpoint_table=table, http_timeout_seconds=0.5, botocore_max_attempts=1)
        clients = ProxiedClients(settings, proxy.url)
        lease = Lease(clients.dynamodb, table, stack.stream_arn, "me", 10.0, FakeClock())
        assert lease.try_acquire()
        before = int(lease_item(stack)["version"]["N"])
        plan.rates["dynamodb:UpdateItem"] = 1.0
        unanswered = lease.renew()
        applied = int(lease_item(stack)["version"]["N"])
        plan.rates.clear()

        renewed = [lease.renew(), lease.renew()]  # the first finds the version it missed, the next renews from it

    assert unanswered and applied == before + 1  # written, though the holder never heard so
    assert renewed == [True, True] and lease.held
    assert lease_item(stack)["owner"]["S"] == lease.owner and int(lease_item(stack)["version"]["N"]) == applied + 1
