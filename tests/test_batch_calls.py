"""Calls shared by the records of a batch: the race check's reads in BatchGetItem.

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

from cleanup.pipeline import run_batch
from schemas.outcomes import ActionStatus, Status
from schemas.records import read_lambda_event
from tests.faults import RawBody
from tests.scenarios.helpers import ProxiedClients, World, new_ids, sequence_number, world
from tests.stack import SessionStack
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


def test_records_of_two_tables_are_read_each_in_its_own_table(world: World, aws: Any) -> None:
    stack = world.stack
    other = f"{stack.table}-b"
    other_stream = create_session_table(stack.ddb, other)
    ids = ["s1", "s2", "s3"]
    for table in (stack.table, other):
        for sid in ids:
            prefix = f"sessions/t1/{table[-8:]}-{sid}/"
            stack.s3.put_object(Bucket=stack.bucket, Key=f"{prefix}part", Body=b"scratch")
            item = {"pk": {"S": f"session#{sid}"}, "sk": {"S": "meta"}, "tenantId": {"S": "t1"}}
            stack.ddb.put_item(TableName=table, Item={**item, "scratchPrefix": {"S": prefix}})
            stack.ddb.delete_item(TableName=table, Key={"pk": item["pk"], "sk": item["sk"]})
    # s1 comes back in the second table only, with the same prefix: there it is live, in the first it is not.
    reborn = {"pk": {"S": "session#s1"}, "sk": {"S": "meta"}, "tenantId": {"S": "t1"}}
    stack.ddb.put_item(TableName=other, Item={**reborn, "scratchPrefix": {"S": f"sessions/t1/{other[-8:]}-s1/"}})
    first = stack.lambda_event()["Records"]
    second = SessionStack(
        stack.aws, other, stack.bucket, stack.key_arn, str(other_stream), stack.ddb, stack.s3, stack.kms, stack.streams
    ).lambda_event()["Records"]

    outcomes = run_batch(read_lambda_event({"Records": [*first, *second]}), world.runtime())

    assert all(o.status is Status.CLEANED for o in outcomes if o.event_name == "REMOVE")
    assert stack.objects(f"sessions/t1/{other[-8:]}-s1/") == [f"sessions/t1/{other[-8:]}-s1/part"]
    assert sorted(stack.objects("sessions/")) == [f"sessions/t1/{other[-8:]}-s1/part"]
    assert operations(world)["BatchGetItem"] >= 2  # one request names one table


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
