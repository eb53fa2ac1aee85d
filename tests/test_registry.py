"""The registry action: a closed connection's room memberships leave the connection registry with its session.

The registry is the connection-state design of one item per (room, connection) membership, rooms sharded over
several partition keys, and a ``byConnection`` index on the connection id (``worker.local.backend``).
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cleanup.actions import registry
from cleanup.aws.clients import Clients
from cleanup.deadline import Deadline
from cleanup.exceptions import OutOfTimeError
from cleanup.queues.reporting import run_batch
from cleanup.runtime import Runtime
from cleanup.telemetry import Metrics, MetricsSink
from schemas.outcomes import ActionStatus, Status
from schemas.records import read_lambda_event
from tests.faults import Unprocessed
from tests.stack import SessionStack, unfenced
from worker import cli
from worker.local.backend import create_registry_table, membership

SHARDS = 4
ROOMS = 30
OTHERS = ("conn-b", "conn-c", "conn-d")


@pytest.fixture
def rooms(stack: SessionStack) -> str:
    """A registry whose 30 rooms each have ``conn-dead`` (held by session ``dead``) and three other connections,
    spread over 4 shards, written as ``join_room`` writes them (with their session's id)."""
    table = f"registry-{stack.table}"
    create_registry_table(stack.ddb, table)
    items = [
        # conn-dead shares its room partition with another member in every room.
        membership(
            f"r{room}",
            connection_id,
            user_id=f"u-{connection_id}",
            shard=(room + n // 2) % SHARDS,
            session_id="dead" if connection_id == "conn-dead" else connection_id.removeprefix("conn-"),
        )
        for room in range(ROOMS)
        for n, connection_id in enumerate(("conn-dead", *OTHERS))
    ]
    for start in range(0, len(items), 25):
        requests = [{"PutRequest": {"Item": item}} for item in items[start : start + 25]]
        assert not stack.ddb.batch_write_item(RequestItems={table: requests}).get("UnprocessedItems")
    return table


def memberships(stack: SessionStack, table: str) -> dict[str, set[str]]:
    """Each connection's rooms, as the table (not the index) holds them."""
    found: dict[str, set[str]] = {}
    for page in stack.ddb.get_paginator("scan").paginate(TableName=table, ConsistentRead=True):
        for item in page["Items"]:
            found.setdefault(item["connectionId"]["S"], set()).add(item["pk"]["S"].split("#")[1])
    return found


def clean(stack: SessionStack, table: str, **settings: Any) -> Any:
    """Delete the session of ``conn-dead`` and run its REMOVE through the core; the outcome of that record."""
    runtime = settings.pop("runtime", None) or runtime_for(stack, table, **settings)
    outcomes = run_batch(read_lambda_event(stack.lambda_event()), runtime, settings.pop("deadline", None))
    return next(o for o in outcomes if o.event_name == "REMOVE")


def runtime_for(stack: SessionStack, table: str, **settings: Any) -> Any:
    return stack.runtime(registry_table=table, ws_callback_url=stack.aws.endpoint_url, **settings)


def action(outcome: Any) -> Any:
    return next(a for a in outcome.actions if a.action == registry.ACTION)


def test_a_closed_connection_leaves_every_room_and_the_other_members_stay(
    stack: SessionStack, rooms: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "QUERY_PAGE", 7)  # five pages of the index: 30 memberships in 7, 7, 7, 7, 2
    stack.put_session("dead", connection_id="conn-dead")
    stack.delete("dead")
    runtime = runtime_for(stack, rooms)
    sent = Unprocessed(runtime.clients.dynamodb, times=0)  # processes everything; records what each call carried

    outcome = clean(stack, rooms, runtime=runtime)

    left = memberships(stack, rooms)
    assert outcome.status is Status.CLEANED
    assert action(outcome).status is ActionStatus.DONE
    assert action(outcome).detail["memberships"] == ROOMS
    assert "conn-dead" not in left
    assert {connection: len(rooms_of) for connection, rooms_of in left.items()} == dict.fromkeys(OTHERS, ROOMS)
    assert max(sent.sizes) <= registry.BATCH and sum(sent.sizes) == ROOMS
    assert sent.attributes == {frozenset({"pk", "sk"})}  # each membership's own key, and nothing else


def test_memberships_are_removed_again_as_already_done(stack: SessionStack, rooms: str) -> None:
    stack.put_session("dead", connection_id="conn-dead")
    stack.delete("dead")
    event = stack.lambda_event()
    runtime = runtime_for(stack, rooms)

    first, again = (run_batch(read_lambda_event(event), runtime)[-1] for _ in range(2))

    assert (action(first).status, action(again).status) == (ActionStatus.DONE, ActionStatus.ALREADY_DONE)
    assert "conn-dead" not in memberships(stack, rooms)


def test_without_a_registry_table_memberships_are_left_to_their_ttl(stack: SessionStack, rooms: str) -> None:
    stack.put_session("dead", connection_id="conn-dead")
    stack.delete("dead")

    outcome = run_batch(read_lambda_event(stack.lambda_event()), stack.runtime(ws_callback_url=stack.aws.endpoint_url))

    assert outcome[-1].status is Status.CLEANED
    assert registry.ACTION not in {a.action for a in outcome[-1].actions}
    assert len(memberships(stack, rooms)["conn-dead"]) == ROOMS


def test_a_reconnected_session_on_the_same_connection_keeps_its_memberships(stack: SessionStack, rooms: str) -> None:
    item = stack.put_session("dead", connection_id="conn-dead")
    stack.delete("dead")
    stack.put_item(item)  # recreated under the same key, on the same connection

    outcome = clean(stack, rooms)

    assert action(outcome).status is ActionStatus.KEPT
    assert len(memberships(stack, rooms)["conn-dead"]) == ROOMS


def test_a_dry_run_counts_the_memberships_and_deletes_none(stack: SessionStack, rooms: str) -> None:
    stack.put_session("dead", connection_id="conn-dead")
    stack.delete("dead")

    outcome = clean(stack, rooms, cleanup_mode="dry-run")

    assert action(outcome).status is ActionStatus.PLANNED
    assert action(outcome).detail["memberships"] == ROOMS
    assert len(memberships(stack, rooms)["conn-dead"]) == ROOMS


def test_only_items_naming_exactly_this_connection_in_their_key_are_deleted(stack: SessionStack, rooms: str) -> None:
    # A row keyed by user, whose connection id the application rewrites on a reconnect: by the time the index says
    # it is conn-dead's, it may be another connection's.
    by_user = {"pk": {"S": "room#lobby#0"}, "sk": {"S": "user#u1"}, "connectionId": {"S": "conn-dead"}}
    # A row whose key names conn-dead but which says it is another connection's.
    mislabelled = {"pk": {"S": "room#audit#0"}, "sk": {"S": "conn#conn-dead"}, "connectionId": {"S": "conn-other"}}
    for row in (by_user, mislabelled):
        stack.ddb.put_item(TableName=rooms, Item=row)
    stack.put_session("dead", connection_id="conn-dead")
    stack.delete("dead")
    runtime = runtime_for(stack, rooms)
    # Index answers that are not conn-dead's: conn-b's own membership, and the mislabelled row.
    other = {"pk": {"S": "room#r0#0"}, "sk": {"S": "conn#conn-b"}, "connectionId": {"S": "conn-b"}}
    runtime.clients.dynamodb.meta.events.register("after-call.dynamodb.Query", answer_also(other, mislabelled))

    outcome = clean(stack, rooms, runtime=runtime)

    left = memberships(stack, rooms)
    assert (action(outcome).detail["memberships"], action(outcome).detail["kept"]) == (ROOMS, 3)
    assert left["conn-dead"] == {"lobby"}
    assert left["conn-other"] == {"audit"}
    assert len(left["conn-b"]) == ROOMS


def answer_also(*items: dict[str, Any]) -> Callable[..., None]:
    """An ``after-call`` hook adding ``items`` to a Query's answer, as an index lagging behind the table might."""

    def hook(parsed: dict[str, Any], **_: Any) -> None:
        parsed.setdefault("Items", []).extend(items)

    return hook


def test_unprocessed_items_are_sent_again_until_deleted(stack: SessionStack, rooms: str) -> None:
    stack.put_session("dead", connection_id="conn-dead")
    stack.delete("dead")
    runtime = runtime_for(stack, rooms)
    unprocessed = Unprocessed(runtime.clients.dynamodb, times=3)

    outcome = clean(stack, rooms, runtime=runtime)

    assert outcome.status is Status.CLEANED
    assert "conn-dead" not in memberships(stack, rooms)
    assert len(unprocessed.sizes) == 3 + 2  # three answers processed nothing; then 25 and 5


def test_unprocessed_items_never_outlive_the_deadline(
    stack: SessionStack, rooms: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "UNPROCESSED_TRIES", 10_000)  # only the deadline can stop it
    stack.put_session("dead", connection_id="conn-dead", grant=False, objects=0)
    stack.delete("dead")
    runtime = runtime_for(stack, rooms, retry_max_wait_seconds=0.05)
    unprocessed = Unprocessed(runtime.clients.dynamodb, times=10_000)
    # Two seconds from the first BatchWriteItem, however long the reads before it took: each re-send is read for
    # first (the fence), and no call starts with less than 0.75 s left.
    deadline = Deadline()

    def start(**_: Any) -> None:
        if deadline.at is None:
            deadline.at = time.monotonic() + 2.0

    runtime.clients.dynamodb.meta.events.register("before-call.dynamodb.BatchWriteItem", start)

    outcome = clean(stack, rooms, runtime=runtime, deadline=deadline)

    assert outcome.status is Status.FAILED and not outcome.permanent
    assert "deadline" in (action(outcome).error or "")
    assert 1 < len(unprocessed.sizes) < 10_000
    assert len(memberships(stack, rooms)["conn-dead"]) == ROOMS


def test_replay_dry_run_shows_the_memberships_it_would_remove(
    worker_env: SessionStack,
    rooms: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stack = worker_env
    monkeypatch.setenv("REGISTRY_TABLE", rooms)
    stack.put_session("dead", connection_id="conn-dead")
    stack.delete("dead")
    saved = tmp_path / "event.json"
    saved.write_text(json.dumps(stack.lambda_event()))

    code = cli.main(["replay", "--dry-run", str(saved)])

    assert code == 0
    assert f"remove conn-dead from {rooms} ({ROOMS} memberships): planned" in capsys.readouterr().out
    assert len(memberships(stack, rooms)["conn-dead"]) == ROOMS


def test_out_of_time_between_pages_keeps_what_was_deleted_and_sends_no_further_query(
    stack: SessionStack, rooms: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "QUERY_PAGE", 7)
    runtime = runtime_for(stack, rooms)
    deadline = Deadline.after(60)
    queries: list[int] = []

    def answered(parsed: dict[str, Any], **_: Any) -> None:
        queries.append(len(parsed.get("Items", [])))

    def time_runs_out(**_: Any) -> None:
        deadline.at = 0.0  # the first batch's answer arrives as the invocation's time ends

    events = runtime.clients.dynamodb.meta.events
    events.register("after-call.dynamodb.Query", answered)
    events.register("after-call.dynamodb.BatchWriteItem", time_runs_out)
    where = registry.Registry(rooms, "byConnection", "connectionId", runtime.table_keys(rooms))

    with pytest.raises(OutOfTimeError, match="7 memberships of 'conn-dead' deleted so far"):
        registry.prune(runtime.clients.dynamodb, where, "conn-dead", deadline, permit=unfenced)

    assert queries == [7]
    assert len(memberships(stack, rooms)["conn-dead"]) == ROOMS - 7


def test_a_registry_failure_fails_the_record_and_counts_as_an_action_failure(stack: SessionStack, rooms: str) -> None:
    item = stack.put_session("dead", connection_id="conn-dead")
    stack.delete("dead")
    out = io.StringIO()
    settings = stack.settings(
        registry_table=rooms,
        registry_connection_index="no-such-index",
        ws_callback_url=stack.aws.endpoint_url,
        metrics_destination="stdout",
    )
    runtime = Runtime(settings, Clients(settings), Metrics(settings, MetricsSink("stdout", stream=out)))

    outcome = clean(stack, rooms, runtime=runtime)

    failures = [json.loads(line) for line in out.getvalue().splitlines() if '"ActionFailures"' in line]
    assert outcome.status is Status.FAILED and outcome.permanent
    assert action(outcome).status is ActionStatus.FAILED and "Query" in (action(outcome).error or "")
    assert [(doc["Action"], doc["ActionFailures"]) for doc in failures] == [(registry.ACTION, 1)]
    assert stack.objects(item["scratchPrefix"]) == [] and item["grantId"] not in stack.grant_ids()
    assert len(memberships(stack, rooms)["conn-dead"]) == ROOMS


def test_a_session_back_on_its_connection_between_two_batches_keeps_its_other_rooms(
    stack: SessionStack, rooms: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fence reads the live item where every BatchWriteItem leaves: the user back on the same connection once the
    # first batch of 25 is answered keeps the five rooms left, and the record is tried again against the item as it
    # is then.
    old = stack.put_session("dead", connection_id="conn-dead")
    stack.delete("dead")
    runtime = runtime_for(stack, rooms)
    writes: list[int] = []

    def back_after_the_first_batch(**_: object) -> None:
        writes.append(1)
        if len(writes) == 1:
            stack.put_item(old)

    runtime.clients.dynamodb.meta.events.register("after-call.dynamodb.BatchWriteItem", back_after_the_first_batch)

    outcome = clean(stack, rooms, runtime=runtime)

    assert len(memberships(stack, rooms)["conn-dead"]) == ROOMS - 25
    assert action(outcome).status is ActionStatus.KEPT and action(outcome).detail["memberships"] == 25
    assert outcome.status is Status.FAILED and not outcome.permanent
