"""Scenario 3: every batch delivered twice and the batches out of order, with sessions recreated under their keys."""

from __future__ import annotations

import random

import pytest

from tests.scenarios.helpers import World, assert_final_state, deliver_like_lambda, new_ids

pytestmark = pytest.mark.slow  # a fault scenario


@pytest.mark.timeout(90)
def test_duplicated_and_reordered_batches_clean_each_session_once_and_spare_recreated_ones(world: World) -> None:
    live = world.make_sessions(new_ids(10, "live"), sockets=2)
    ended = world.make_sessions(new_ids(120, "end"), sockets=10)
    kept = world.plant_sentinels()
    world.end(ended)
    # The reconnect race: ten keys get a new session before their REMOVEs are read; it reuses the scratch prefix
    # (same id) and has a new grant and, for two, a new socket. The old grant and socket go, the prefix stays.
    reborn = world.make_sessions([made.id for made in ended[:10]], sockets=2)
    records = world.records()
    batches = [records[start : start + 25] for start in range(0, len(records), 25)]
    order = [*range(len(batches)), *range(len(batches))]
    random.Random(7).shuffle(order)
    world.plan.rate = 0.1
    invoke = world.invoker(world.runtime())

    deliveries = [deliver_like_lambda(batches[index], invoke, batch_size=25) for index in order]

    world.plan.enabled = False
    assert_final_state(world, deleted=ended, live=[*live, *reborn], kept=kept)
    assert sum(d.invocations for d in deliveries) >= 2 * len(batches)
