"""The backlog: under a RetireGrant quota, records whose grant has no turn soon leave the stream for the backlog queue,
with only the grant left; the drain retires it later, through the same core, and harms no re-created session."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from benchmarks.mapping import Context, MappingSettings, deliver, drain_queue
from tests.scenarios.helpers import World, assert_final_state, new_ids
from tests.stack import shared_client
from worker import backlog as backlog_handler
from worker import lambda_handler

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

QUOTA = 10.0


def _queue() -> str:
    return str(shared_client("sqs").create_queue(QueueName=f"backlog-{time.monotonic_ns()}")["QueueUrl"])


def _removes(world: World) -> list[dict[str, Any]]:
    return [record for record in world.records() if record["eventName"] == "REMOVE"]


def _stream_runtime(world: World, queue: str, **overrides: Any) -> Any:
    return world.runtime(backlog_queue_url=queue, quota_wait_seconds=0.1, retry_max_wait_seconds=2.0, **overrides)


def test_records_waiting_for_the_grant_quota_are_deferred_with_only_the_grant_left(world: World) -> None:
    ended = world.make_sessions(new_ids(120, "defer"), sockets=5)
    world.end(ended)
    queue = _queue()
    world.plan.quotas = {"kms:RetireGrant": QUOTA}
    # Only the grant quota is the point: every other answer gets time to come (moto under load can take more than
    # the scenarios' 0.5 s), so that what is deferred, and with what left, is what the quota decided.
    runtime = _stream_runtime(world, queue, http_timeout_seconds=10.0, bulk_timeout_seconds=10.0)
    with lambda_handler.warm.use(runtime):
        answer = lambda_handler.handler({"Records": _removes(world)}, Context(30.0))

    world.plan.enabled = False
    bodies = [json.loads(body) for body in _drain_bodies(queue)]
    assert answer == {"batchItemFailures": []}  # nothing left for the stream to deliver again
    assert bodies and all(body["remaining"] == ["grant"] for body in bodies)
    assert len(world.stack.grant_ids() & {made.grant_id for made in ended}) == len(bodies)  # still to retire
    assert world.stack.objects("sessions/") == []  # scratch data freed at once
    assert all(made.socket is None or made.socket.wait_closed(5.0) for made in ended)


def test_records_are_deferred_under_a_low_grant_quota_their_messages_tagged_apart_from_it(world: World) -> None:
    # The deferred messages are tagged by KMS (GenerateMac): not at RetireGrant's rate, a few a second.
    ended = world.make_sessions(new_ids(40, "low"), sockets=5)
    world.end(ended)
    queue = _queue()
    world.plan.quotas = {"kms:RetireGrant": 3.0}
    with lambda_handler.warm.use(_stream_runtime(world, queue)):
        answer = lambda_handler.handler({"Records": _removes(world)}, Context(30.0))

    world.plan.enabled = False
    bodies = [json.loads(body) for body in _drain_bodies(queue)]
    assert answer == {"batchItemFailures": []}  # each record done or deferred, none left for the stream
    assert bodies and all(body["remaining"] == ["grant"] for body in bodies)
    assert len(world.stack.grant_ids() & {made.grant_id for made in ended}) == len(bodies)


def test_a_batch_deferred_at_once_is_tagged_together_within_the_invocation(world: World) -> None:
    # Each deferred message costs a GenerateMac; at 0.3 s each, one after the other, the 30 records' tags would take
    # about 9 s, past the 6 s invocation: the records left untagged would be reported failed and delivered again.
    ended = world.make_sessions(new_ids(30, "tags"), sockets=3)
    world.end(ended)
    queue = _queue()
    world.plan.quotas = {"kms:RetireGrant": 1.0}
    world.plan.latency = {"kms:GenerateMac": 0.3}
    runtime = _stream_runtime(world, queue, http_timeout_seconds=10.0, bulk_timeout_seconds=10.0)
    with lambda_handler.warm.use(runtime):
        answer = lambda_handler.handler({"Records": _removes(world)}, Context(6.0))

    world.plan.enabled = False
    bodies = [json.loads(body) for body in _drain_bodies(queue)]
    assert answer == {"batchItemFailures": []}  # every record done or deferred in this one invocation
    assert len(bodies) >= 20 and all(body["remaining"] == ["grant"] for body in bodies)
    assert len(world.stack.grant_ids() & {made.grant_id for made in ended}) == len(bodies)


def test_a_burst_under_the_quota_is_freed_whole_through_the_backlog_with_nothing_lost(world: World) -> None:
    ended = world.make_sessions(new_ids(300, "burst"), sockets=10)
    live = world.make_sessions(new_ids(3, "live"), sockets=2)
    world.end(ended)
    queue = _queue()
    world.plan.quotas = {"kms:RetireGrant": QUOTA}
    # As above: only the grant quota is the point. With the scenarios' 0.5 s answers and 8 s invocations, a machine
    # running two suites failed six deliveries in a row of one range, which then went to the on-failure queue.
    stream = _stream_runtime(world, queue, http_timeout_seconds=10.0, bulk_timeout_seconds=10.0)
    drainer = world.runtime(retry_max_wait_seconds=2.0)

    def invoke_stream(event: dict[str, Any], context: Any) -> dict[str, Any]:
        with lambda_handler.warm.use(stream):
            return lambda_handler.handler(event, context)

    def invoke_drain(event: dict[str, Any], context: Any) -> dict[str, Any]:
        with backlog_handler.warm.use(drainer):
            return backlog_handler.handler(event, context)

    lost: list[Any] = []
    mapping = MappingSettings(batch_size=100, timeout=30.0, retry_attempts=5, record_age=-1)
    delivered = deliver(_removes(world), invoke_stream, mapping, lambda batch, why: lost.append(batch))
    drain_queue(shared_client("sqs"), queue, invoke_drain, timeout=8.0, concurrency=2, stream_done=lambda: True)

    world.plan.enabled = False
    assert lost == [] and delivered.discarded == 0
    assert_final_state(world, deleted=ended, live=live)


def _drain_bodies(queue: str) -> list[str]:
    sqs = shared_client("sqs")
    bodies: list[str] = []
    while messages := sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get("Messages", []):
        bodies += [message["Body"] for message in messages]
        for message in messages:
            sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
    return bodies
