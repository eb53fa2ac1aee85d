"""The checkpoint table and the stream lease, against moto over HTTP."""

from __future__ import annotations

from typing import Any

import pytest

from cleanup.exceptions import LeaseLostError
from cleanup.streams.checkpoints import Checkpoint, CheckpointStore, ensure_table
from cleanup.streams.lease import Lease
from tests.stack import client

STREAM = "arn:aws:dynamodb:us-east-1:123456789012:table/sessions/stream/2024-01-01T00:00:00.000"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def table(stack: Any) -> str:
    name = f"ckpt-{stack.table}"
    ensure_table(stack.ddb, name)
    return name


def lease(stack: Any, table: str, owner: str, clock: Clock | None = None) -> Lease:
    return Lease(stack.ddb, table, STREAM, owner, 10.0, clock or Clock())


def test_the_table_is_created_on_demand_once(stack):
    name = f"ckpt-{stack.table}"

    ensure_table(stack.ddb, name)
    ensure_table(stack.ddb, name)

    described = stack.ddb.describe_table(TableName=name)["Table"]
    assert described["TableStatus"] == "ACTIVE"
    assert described["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"


def test_checkpoints_are_saved_and_loaded_per_shard(stack, table):
    holder = lease(stack, table, "a")
    assert holder.try_acquire()
    store = CheckpointStore(stack.ddb, table, STREAM, holder)

    store.save("shard-1", Checkpoint("100"))
    store.save("shard-0", Checkpoint("42", finished=True))

    assert store.load() == {"shard-1": Checkpoint("100"), "shard-0": Checkpoint("42", finished=True)}


def test_a_held_lease_keeps_a_standby_waiting_while_it_is_renewed(stack, table):
    holder, clock = lease(stack, table, "a"), Clock()
    standby = lease(stack, table, "b", clock)
    assert holder.try_acquire()

    results = []
    for _ in range(5):
        results.append(standby.try_acquire())
        clock.now += 6
        assert holder.renew()

    assert results == [False] * 5
    assert holder.held


def test_a_standby_takes_over_a_lease_unrenewed_for_lease_seconds_and_the_old_holder_is_fenced(stack, table):
    holder, clock = lease(stack, table, "a"), Clock()
    standby = lease(stack, table, "b", clock)
    assert holder.try_acquire()
    assert not standby.try_acquire()
    clock.now += 9.9
    assert not standby.try_acquire()
    clock.now += 0.2

    assert standby.try_acquire()
    assert not holder.renew()
    with pytest.raises(LeaseLostError):
        CheckpointStore(stack.ddb, table, STREAM, holder).save("shard-1", Checkpoint("7"))
    assert CheckpointStore(stack.ddb, table, STREAM, standby).load() == {}


def test_a_released_lease_is_taken_at_once(stack, table):
    holder, standby = lease(stack, table, "a"), lease(stack, table, "b")
    assert holder.try_acquire()

    holder.release()

    assert standby.try_acquire()
    assert not holder.held


class LateAnswers:
    """Holds the answers of a client's UpdateItem: the write reaches moto at once, its answer comes back late.

    While the answer is "in flight", ``meanwhile`` runs (a standby reading the lease), then the shared clock moves on
    by ``seconds``: the holder learns of its write only then.
    """

    def __init__(self, client: Any, clock: Clock, seconds: float) -> None:
        self.clock = clock
        self.seconds = seconds
        self.armed = False
        self.meanwhile: list[Any] = []
        client.meta.events.register("after-call.dynamodb.UpdateItem", self._late)

    def _late(self, **_: Any) -> None:
        if self.armed:
            self.armed = False
            for step in self.meanwhile:
                step()
            self.clock.now += self.seconds


@pytest.mark.parametrize("late", ["renewal", "take-over"])
def test_a_holder_whose_answer_comes_back_late_has_given_up_its_lease_before_a_standby_takes_it(stack, table, late):
    clock = Clock()
    holder_client = client("dynamodb")
    answers = LateAnswers(holder_client, clock, 2.5)
    holder = Lease(holder_client, table, STREAM, "a", 10.0, clock)
    standby = lease(stack, table, "b", clock)
    answers.meanwhile.append(lambda: standby.try_acquire())  # the standby sees the new version before the holder
    answers.armed = late == "take-over"
    assert holder.try_acquire()
    if late == "renewal":
        clock.now += 5
        answers.armed = True
        assert holder.renew()

    while not standby.try_acquire():
        assert holder.held
        clock.now += 0.5

    assert not holder.held
