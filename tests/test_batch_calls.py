"""Calls shared by the records of a batch: the race check's reads in BatchGetItem, scratch pages in DeleteObjects.

Calls are counted with botocore ``before-call`` events (``ProxiedClients``); what each record's outcome says is
checked against what is left in S3, KMS and DynamoDB.
"""

from __future__ import annotations

import copy
import json
import threading
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse

from cleanup.actions import scratch
from cleanup.aws.coalesce import READ, SEND_BY_SECONDS, Batchmates, Coalescer, Part
from cleanup.core.guard import ScratchLocation
from cleanup.deadline import Deadline
from cleanup.exceptions import PermanentError, UnsafePrefixError
from cleanup.queues.reporting import run_batch
from schemas.outcomes import ActionStatus, Status
from schemas.records import read_lambda_event
from tests.faults import RawBody
from tests.scenarios.helpers import ProxiedClients, World, assert_final_state, new_ids, sequence_number, world
from tests.stack import SessionStack, page_gate
from worker.local.backend import create_session_table

__all__ = ["world"]

pytestmark = pytest.mark.timeout(90)


def operations(world: World) -> dict[str, int]:
    """Calls made by the runtimes of ``world`` so far, by operation."""
    counts: dict[str, int] = {}
    for runtime in world.runtimes:
        assert isinstance(runtime.clients, ProxiedClients)
        for (_, operation), count in runtime.clients.operations.items():
            counts[operation] = counts.get(operation, 0) + count
    return counts


def by_key(outcomes: list[Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """Outcomes of REMOVE records by the session id in their partition key."""
    keys = {sequence_number(r): r["dynamodb"]["Keys"]["pk"]["S"].removeprefix("session#") for r in records}
    return {keys[o.sequence_number]: o for o in outcomes if o.event_name == "REMOVE"}


def test_a_batch_reads_its_live_items_and_deletes_its_pages_in_shared_calls(world: World) -> None:
    ended = world.make_sessions(new_ids(64, "end"), sockets=4, objects=3)
    kept = world.plant_sentinels()
    world.end(ended)

    runtime = world.runtime(http_timeout_seconds=5.0, bulk_timeout_seconds=30.0, botocore_max_attempts=3)

    answer = world.invoker(runtime)({"Records": world.records()})

    calls = operations(world)
    assert answer == {"batchItemFailures": []}
    assert_final_state(world, deleted=ended, live=[], kept=kept)
    assert "GetItem" not in calls
    assert calls["RetireGrant"] >= len(ended) and calls["ListObjectsV2"] >= len(ended)
    # Unshared, each record would make its own: at least 64 reads and 64 deletions. How many records share a call
    # depends on the machine's speed (a read older than FENCE_READ_MAX_AGE_SECONDS at its send is taken again), so
    # the figure belongs to the benchmarks; here, that the calls are shared at all.
    assert 1 <= calls["BatchGetItem"] < len(ended)
    assert 1 <= calls["DeleteObjects"] < len(ended)


def test_in_a_batch_of_two_tables_records_only_session_tables_are_cleaned(world: World, aws: Any) -> None:
    stack = world.stack
    other = f"{stack.table}-b"
    other_stream = create_session_table(stack.ddb, other)
    ids = ["s1", "s2", "s3"]
    for table in (stack.table, other):
        for sid in ids:
            prefix = f"sessions/{table[-8:]}/{sid}/"  # the tenant's folder of the session (SESSION_BINDING)
            stack.s3.put_object(Bucket=stack.bucket, Key=f"{prefix}part", Body=b"scratch")
            item = {"pk": {"S": f"session#{sid}"}, "sk": {"S": "meta"}, "tenantId": {"S": table[-8:]}}
            stack.ddb.put_item(TableName=table, Item={**item, "scratchPrefix": {"S": prefix}})
            stack.ddb.delete_item(TableName=table, Key={"pk": item["pk"], "sk": item["sk"]})
    first = stack.lambda_event()["Records"]
    second = SessionStack(
        stack.aws, other, stack.bucket, stack.key_arn, str(other_stream), stack.ddb, stack.s3, stack.kms, stack.streams
    ).lambda_event()["Records"]

    outcomes = run_batch(read_lambda_event({"Records": [*first, *second]}), world.runtime())

    removes = [o for o in outcomes if o.event_name == "REMOVE"]
    assert [o.status for o in removes] == [Status.CLEANED] * 3 + [Status.SKIPPED] * 3  # SESSION_TABLE's, then other's
    assert sorted(stack.objects("sessions/")) == [f"sessions/{other[-8:]}/{sid}/part" for sid in ids]


class Unprocessed:
    """Answers the first BatchGetItem with every key left unprocessed, as DynamoDB may under load."""

    def __init__(self, dynamodb: Any) -> None:
        self.answered = 0
        self._lock = threading.Lock()
        dynamodb.meta.events.register("before-send.dynamodb.BatchGetItem", self._answer)

    def _answer(self, request: Any, **_: Any) -> AWSResponse | None:
        with self._lock:
            if self.answered:
                return None
            self.answered += 1
        asked = json.loads(request.body)["RequestItems"]
        body = json.dumps({"Responses": {table: [] for table in asked}, "UnprocessedKeys": asked}).encode()
        return AWSResponse(request.url, 200, {"Content-Type": "application/x-amz-json-1.0"}, RawBody(body))


def test_keys_left_unprocessed_are_asked_again_and_a_live_session_keeps_its_data(world: World) -> None:
    stack = world.stack
    ended = world.make_sessions(new_ids(4, "end"), objects=2)
    world.end(ended)
    reborn = ended[0]  # recreated under its key with its prefix: its data is live again
    stack.put_item({"pk": f"session#{reborn.id}", "sk": "meta", "tenantId": "t1", "scratchPrefix": reborn.prefix})
    records = world.records()
    runtime = world.runtime()
    unprocessed = Unprocessed(runtime.clients.dynamodb)

    outcomes = run_batch(read_lambda_event({"Records": records}), runtime)

    assert unprocessed.answered == 1
    assert operations(world)["BatchGetItem"] >= 2
    scratch_of = {
        sid: {a.action: a.status for a in o.actions}["scratch"] for sid, o in by_key(outcomes, records).items()
    }
    assert scratch_of == {made.id: ActionStatus.DONE for made in ended[1:]} | {reborn.id: ActionStatus.KEPT}
    assert sorted(stack.objects("sessions/")) == sorted(reborn.objects)


def test_an_unreadable_live_item_fails_its_record_only_and_keeps_everything_it_names(world: World) -> None:
    stack = world.stack
    ended = world.make_sessions(new_ids(4, "end"), objects=2)
    world.end(ended)
    odd = ended[0]
    stack.ddb.put_item(
        TableName=stack.table,
        Item={"pk": {"S": f"session#{odd.id}"}, "sk": {"S": "meta"}, "scratchPrefix": {"N": "5"}},
    )
    records = world.records()

    outcomes = by_key(run_batch(read_lambda_event({"Records": records}), world.runtime()), records)

    assert outcomes[odd.id].status is Status.FAILED and outcomes[odd.id].permanent
    assert "unreadable" in (outcomes[odd.id].error or "")
    assert all(outcomes[made.id].status is Status.CLEANED for made in ended[1:])
    assert sorted(stack.objects("sessions/")) == sorted(odd.objects)
    assert stack.grant_ids() == {odd.grant_id}


def test_a_key_that_fails_the_shared_read_fails_its_own_record_only(world: World) -> None:
    ended = world.make_sessions(new_ids(4, "end"), objects=2)
    world.end(ended)
    records = world.records()
    hostile = copy.deepcopy(records[-1])
    hostile["dynamodb"]["SequenceNumber"] = f"{sequence_number(records[-1])}9"
    hostile["dynamodb"]["Keys"] = {"pk": {"S": "session#hostile"}}  # no sort key: the whole BatchGetItem is refused
    hostile["dynamodb"]["OldImage"] = {"pk": {"S": "session#hostile"}, "scratchPrefix": {"S": "sessions/t1/hostile/"}}
    world.stack.s3.put_object(Bucket=world.stack.bucket, Key="sessions/t1/hostile/part", Body=b"keep")

    outcomes = run_batch(read_lambda_event({"Records": [*records, hostile]}), world.runtime())

    failed = [o for o in outcomes if o.failed]
    assert [o.sequence_number for o in failed] == [sequence_number(hostile)]
    assert failed[0].permanent and "BatchGetItem" in (failed[0].error or "")
    assert world.stack.objects("sessions/") == ["sessions/t1/hostile/part"]
    assert world.stack.grant_ids() == set()


def locked_stack(aws: Any, name: str) -> SessionStack:
    """A stack whose bucket has object lock (versioned): a legal hold makes DeleteObjects answer a per-key error."""
    stack = SessionStack.create(aws, name)
    stack.bucket = f"{stack.bucket}-lock"
    stack.s3.create_bucket(Bucket=stack.bucket, ObjectLockEnabledForBucket=True)
    return stack


def versions(stack: SessionStack, prefix: str) -> list[dict[str, str]]:
    listed = stack.s3.list_object_versions(Bucket=stack.bucket, Prefix=prefix).get("Versions", [])
    return [{"Key": v["Key"], "VersionId": v["VersionId"]} for v in listed]


def test_each_per_key_error_of_a_shared_delete_fails_the_session_of_that_key_only(aws: Any, request: Any) -> None:
    stack = locked_stack(aws, request.node.name)
    prefixes = [f"sessions/t1/s{n}/" for n in range(3)]
    for prefix in prefixes:
        for part in ("a", "b"):
            stack.s3.put_object(Bucket=stack.bucket, Key=f"{prefix}{part}", Body=b"scratch")
    held = f"{prefixes[1]}b"
    stack.s3.put_object_legal_hold(Bucket=stack.bucket, Key=held, LegalHold={"Status": "ON"})
    runtime = stack.runtime()
    deadline = Deadline.after(30)
    parts: list[Part[scratch.Page, int]] = [
        Part(
            scratch.Page(
                ScratchLocation(stack.bucket, prefix), versions(stack, prefix), gate=page_gate(stack.bucket, prefix)
            ),
            2,
            deadline,
        )
        for prefix in prefixes
    ]

    scratch.delete_pages(runtime.clients.s3, parts, deadline)

    assert [part.answered for part in parts] == [True, True, True]
    assert [part.result for part in parts] == [2, None, 2]
    assert isinstance(parts[1].error, PermanentError) and "AccessDenied" in str(parts[1].error)
    assert prefixes[1] in str(parts[1].error)
    assert [v["Key"] for v in versions(stack, "sessions/")] == [held]


def test_a_key_outside_its_own_prefix_is_not_sent_and_fails_its_session_only(stack: SessionStack) -> None:
    for key in ("sessions/t1/a/1", "sessions/t1/b/1", "sessions/t1/c/1"):
        stack.s3.put_object(Bucket=stack.bucket, Key=key, Body=b"scratch")
    deadline = Deadline.after(30)
    where_a, where_b = ScratchLocation(stack.bucket, "sessions/t1/a/"), ScratchLocation(stack.bucket, "sessions/t1/b/")
    good = Part(
        scratch.Page(where_a, [{"Key": "sessions/t1/a/1"}], gate=page_gate(stack.bucket, where_a.prefix)), 1, deadline
    )
    # A page claiming another session's key (a bug, or a listing that lies): checked again right before the call.
    stray = Part(
        scratch.Page(where_b, [{"Key": "sessions/t1/c/1"}], gate=page_gate(stack.bucket, where_b.prefix)), 1, deadline
    )

    scratch.delete_pages(stack.runtime().clients.s3, [good, stray], deadline)

    assert good.result == 1 and good.error is None
    assert isinstance(stray.error, UnsafePrefixError)
    assert sorted(stack.objects("sessions/")) == ["sessions/t1/b/1", "sessions/t1/c/1"]


def test_a_per_key_error_in_a_shared_delete_fails_only_its_record_end_to_end(aws: Any, request: Any) -> None:
    stack = locked_stack(aws, request.node.name)
    items = [stack.put_session(f"s{n}", objects=2) for n in range(4)]
    held = f"{items[2]['scratchPrefix']}part-00001"
    stack.s3.put_object_legal_hold(Bucket=stack.bucket, Key=held, LegalHold={"Status": "ON"})
    for n in range(4):
        stack.delete(f"s{n}")
    event = stack.lambda_event()

    outcomes = by_key(run_batch(read_lambda_event(event), stack.runtime()), event["Records"])

    assert outcomes["s2"].status is Status.FAILED and outcomes["s2"].permanent
    assert "AccessDenied" in (outcomes["s2"].error or "")
    assert all(outcomes[f"s{n}"].status is Status.CLEANED for n in (0, 1, 3))
    assert [v["Key"] for v in versions(stack, "sessions/")] == [held]
    assert stack.grant_ids() == set()  # the failed record's other actions still ran


def test_a_shared_delete_that_fails_as_a_whole_fails_only_the_records_whose_keys_it_carried(world: World) -> None:
    stack = world.stack
    with_data = world.make_sessions(new_ids(5, "data"), objects=2)
    without = world.make_sessions(new_ids(5, "none"), objects=0)
    world.end([*with_data, *without])
    world.plan.rates = {"s3:DeleteObjects": 1.0}
    world.plan.kinds = ("access-denied",)
    records = world.records()

    outcomes = by_key(run_batch(read_lambda_event({"Records": records}), world.runtime()), records)

    world.plan.enabled = False
    assert {sid for sid, o in outcomes.items() if o.failed} == {made.id for made in with_data}
    assert all(outcomes[made.id].permanent and "DeleteObjects" in (outcomes[made.id].error or "") for made in with_data)
    assert all(outcomes[made.id].status is Status.CLEANED for made in without)
    assert sorted(stack.objects("sessions/")) == sorted(key for made in with_data for key in made.objects)
    assert stack.grant_ids() == set()
    assert world.plan.by_call[("s3", "DeleteObjects", "access-denied")] < len(with_data)  # they shared calls


def test_a_part_near_its_deadline_is_sent_while_there_is_time_for_the_call() -> None:
    # Another worker is counted on its way but never comes, and the waits are long: only the deadline can send it.
    mates = Batchmates(workers=2, quiet=30.0, max_wait=30.0)
    left_at_send: list[float] = []

    def send(parts: list[Part[str, str]], deadline: Deadline) -> None:
        left_at_send.append(deadline.remaining())
        for part in parts:
            part.answer(part.item.upper())

    reader: Coalescer[str, str] = Coalescer(mates, READ, send, 100)
    deadline = Deadline.after(SEND_BY_SECONDS + 0.5)
    with mates.worker():
        answer = reader.submit("key", 1, deadline)

    assert answer == "KEY"
    assert left_at_send and left_at_send[0] >= SEND_BY_SECONDS - 0.25  # a call's worth of time was left
