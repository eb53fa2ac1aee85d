"""Tables the project's write path did not write, cleaned with the default binding (SESSION_BINDING=own).

The shape of a common session table: ``pk = session#<id>``, the grant's id in the item, grants created without a
name and with the worker's role as their retiring principal. The default frees a grant named for its own session and
an unnamed grant made for this worker to retire; a grant named for another session (a forged or misplaced name), one
named otherwise, or an unnamed one some other principal retires, is kept, its record failing with the fix.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest

from cleanup.queues.reporting import run_batch
from schemas.outcomes import ActionStatus, Status
from schemas.records import read_lambda_event
from tests.stack import SessionStack, client, to_av

AGENT = "arn:aws:iam::123456789012:role/agent"


def worker_arn() -> str:
    """The worker's own principal, as an application names it in CreateGrant's RetiringPrincipal (moto's caller is
    an IAM user)."""
    return str(client("sts").get_caller_identity()["Arn"]).replace(":sts::", ":iam::")


def unnamed_grant(stack: SessionStack, retiring: str | None = None) -> str:
    """A grant as a handler that names none creates it, retired by ``retiring`` (the worker's own role by default)."""
    return str(
        stack.kms.create_grant(
            KeyId=stack.key_arn,
            GranteePrincipal=AGENT,
            Operations=["Decrypt"],
            RetiringPrincipal=retiring or worker_arn(),
        )["GrantId"]
    )


def every_type(session_id: str, stack: SessionStack, grant_id: str) -> dict[str, Any]:
    """An item holding every DynamoDB attribute type besides its resources."""
    return {
        "pk": f"session#{session_id}",
        "sk": "meta",
        "tenantId": "t1",
        "scratchPrefix": f"s3://{stack.bucket}/sessions/{session_id}/",
        "grantId": grant_id,
        "ttl": 1_700_000_000,
        "count": Decimal("3.5"),
        "blob": b"\x00\xffblob",
        "flag": True,
        "nothing": None,
        "tags": ["a", Decimal(1), {"nested": [b"x"]}],
        "meta": {"client": "ide", "retries": Decimal(0)},
        "names": {"x", "y"},
        "numbers": {Decimal(1), Decimal(2)},
        "blobs": {b"\x01", b"\x02"},
    }


def test_an_unnamed_grant_made_for_the_worker_is_retired_by_default_from_an_item_of_every_type(
    stack: SessionStack,
) -> None:
    grant_id = unnamed_grant(stack)
    stack.put_objects([f"sessions/s-1/part-{n}" for n in range(3)])
    stack.put_item(every_type("s-1", stack, grant_id))
    stack.delete("s-1")

    [outcome] = run_batch(read_lambda_event(stack.lambda_event()), stack.runtime())[-1:]

    assert outcome.status is Status.CLEANED, outcome.error
    assert grant_id not in stack.grant_ids()
    assert stack.objects("sessions/s-1/") == []


@pytest.mark.parametrize(
    ("name", "retiring", "says"),
    [
        ("session:victim", None, "session:victim"),  # named for another session
        ("agent-tools", None, "agent-tools"),  # named otherwise
        (None, "arn:aws:iam::123456789012:role/someone-else", "someone-else"),  # unnamed, not made for the worker
    ],
    ids=["named-for-another-session", "named-otherwise", "unnamed-for-another-principal"],
)
def test_by_default_a_grant_not_made_for_this_session_or_worker_is_kept_with_the_fix(
    stack: SessionStack, name: str | None, retiring: str | None, says: str
) -> None:
    extra = {} if name is None else {"Name": name}
    victims = stack.kms.create_grant(
        KeyId=stack.key_arn,
        GranteePrincipal=AGENT,
        Operations=["Decrypt"],
        RetiringPrincipal=retiring or worker_arn(),
        **extra,
    )["GrantId"]
    item = stack.put_session("own", grant=False, extra={"grantId": victims})
    stack.delete("own")

    outcome = run_batch(read_lambda_event(stack.lambda_event()), stack.runtime())[-1]

    grant = {result.action: result for result in outcome.actions}["grant"]
    assert victims in stack.grant_ids()
    assert outcome.status is Status.FAILED and outcome.permanent
    assert grant.status is ActionStatus.FAILED and grant.detail.get("unbound") is True
    assert says in (grant.error or "") and "SESSION_BINDING" in (grant.error or "")
    assert stack.objects(item["scratchPrefix"]) == []  # its own scratch data is still freed


def test_strict_binding_keeps_an_unnamed_grant_that_the_default_frees(stack: SessionStack) -> None:
    grant_id = unnamed_grant(stack)
    stack.put_session("own", grant=False, extra={"grantId": grant_id})
    stack.delete("own")

    outcome = run_batch(read_lambda_event(stack.lambda_event()), stack.runtime(session_binding="strict"))[-1]

    assert outcome.status is Status.FAILED and grant_id in stack.grant_ids()
    assert "SESSION_BINDING=own" in (outcome.error or "")


def test_a_dry_run_counts_the_grants_it_would_keep_as_unbound_and_frees_nothing(stack: SessionStack) -> None:
    kept = stack.kms.create_grant(KeyId=stack.key_arn, GranteePrincipal=AGENT, Operations=["Decrypt"], Name="x:y")
    freed = unnamed_grant(stack)
    stack.put_session("a", grant=False, extra={"grantId": kept["GrantId"]})
    stack.put_session("b", grant=False, extra={"grantId": freed})
    stack.delete("a")
    stack.delete("b")
    runtime = stack.runtime(cleanup_mode="dry-run")

    outcomes = [o for o in run_batch(read_lambda_event(stack.lambda_event()), runtime) if o.event_name == "REMOVE"]

    grants = [{r.action: r for r in o.actions}["grant"] for o in outcomes]
    assert [g.detail.get("unbound") for g in grants] == [True, None]
    assert [o.status for o in outcomes] == [Status.FAILED, Status.PLANNED]
    assert {kept["GrantId"], freed} <= stack.grant_ids()


@pytest.fixture
def binary_table(stack: SessionStack) -> tuple[str, str]:
    """A table keyed by a binary partition key alone (no sort key), with its stream: (name, stream ARN)."""
    name = f"blobs-{uuid.uuid4().hex[:10]}"
    described = stack.ddb.create_table(
        TableName=name,
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "B"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    )["TableDescription"]
    return name, str(described["LatestStreamArn"])


def test_a_binary_keyed_tables_scratch_prefix_not_named_for_its_id_is_deleted_by_default(
    stack: SessionStack, binary_table: tuple[str, str]
) -> None:
    table, stream_arn = binary_table
    key = uuid.uuid4().bytes
    prefix = f"sessions/t1/{uuid.uuid4()}/"  # a folder of the application's own naming
    grant_id = unnamed_grant(stack)
    stack.put_objects([f"{prefix}part-{n}" for n in range(3)])
    item = {"pk": key, "tenantId": "t1", "scratchPrefix": prefix, "grantId": grant_id, "ttl": 1_700_000_000}
    stack.ddb.put_item(TableName=table, Item=to_av(item))
    stack.ddb.delete_item(TableName=table, Key={"pk": {"B": key}})
    event = replace(stack, table=table, stream_arn=stream_arn, _iterator=None).lambda_event()
    for record in event["Records"]:  # moto encodes a binary key twice in Keys; DynamoDB sends it as in the image
        image = record["dynamodb"].get("OldImage") or record["dynamodb"]["NewImage"]
        record["dynamodb"]["Keys"] = {"pk": image["pk"]}

    outcome = run_batch(read_lambda_event(event), stack.runtime(session_table=table))[-1]

    assert outcome.event_name == "REMOVE" and outcome.status is Status.CLEANED, outcome.error
    assert stack.objects(prefix) == [] and grant_id not in stack.grant_ids()


def test_by_default_a_prefix_named_for_another_session_is_still_kept(stack: SessionStack) -> None:
    stack.put_objects(["sessions/t1/victim/part-0"])
    stack.put_session("own", grant=False, objects=0, extra={"scratchPrefix": "sessions/t1/victim/"})
    stack.delete("own")

    outcome = run_batch(read_lambda_event(stack.lambda_event()), stack.runtime())[-1]

    scratch = {result.action: result for result in outcome.actions}["scratch"]
    assert stack.objects("sessions/t1/victim/") == ["sessions/t1/victim/part-0"]
    assert scratch.status is ActionStatus.FAILED and scratch.detail.get("unbound") is True


def batch_write(stack: SessionStack, requests: list[dict[str, Any]]) -> None:
    for start in range(0, len(requests), 25):
        pending = {stack.table: requests[start : start + 25]}
        while pending:  # moto processes every item; a real table may leave some for another call
            pending = stack.ddb.batch_write_item(RequestItems=pending).get("UnprocessedItems") or {}


@pytest.mark.slow
@pytest.mark.timeout(600)  # 8,000 calls to moto on a loaded 2-core machine: a bound, not a measure
def test_a_batch_of_2000_records_with_unnamed_grants_is_cleaned_by_default_and_its_redelivery_is_already_done(
    stack: SessionStack,
) -> None:
    """2,000 REMOVE records in one Lambda event: 1,999 sessions of the common shape, each with a socket and every
    fifth with an unnamed grant made for the worker (400 grants), and one item naming a grant named for another
    session. Against moto: the first delivery retires the 400 grants and cleans every session, the redelivery finds
    them all done, and the other session's grant is kept in both. (The worker's memory and time in a batch of 10,000,
    Lambda's largest, are the benchmarks' ``benchmarks/invoke.py``.)"""
    victims = stack.kms.create_grant(
        KeyId=stack.key_arn, GranteePrincipal=AGENT, Operations=["Decrypt"], Name="session:victim"
    )["GrantId"]
    grants = {n: unnamed_grant(stack) for n in range(0, 1_999, 5)}
    items = [
        {"pk": f"session#b-{n}", "sk": "meta", "tenantId": "t1", "connectionId": f"C{n:014d}=", "ttl": 1_700_000_000}
        for n in range(1_999)
    ]
    for n, grant in grants.items():
        items[n]["grantId"] = grant
    items.append({"pk": "session#holder", "sk": "meta", "tenantId": "t1", "grantId": victims})
    batch_write(stack, [{"PutRequest": {"Item": to_av(item)}} for item in items])
    batch_write(stack, [{"DeleteRequest": {"Key": to_av({"pk": i["pk"], "sk": "meta"})}} for i in items])
    removes = [record for record in stack.new_records() if record["eventName"] == "REMOVE"]
    event = read_lambda_event(stack.lambda_event(removes))
    runtime = stack.runtime(ws_callback_url=stack.aws.endpoint_url)  # every other setting at its default

    first = run_batch(event, runtime)
    again = run_batch(event, runtime)

    assert len(removes) == 2_000
    for outcomes in (first, again):
        failed = [o for o in outcomes if o.status is not Status.CLEANED]
        assert [o.key for o in failed] == [f"{stack.table}:pk=session#holder,sk=meta"] and failed[0].permanent
    # Each of the 400 retired: DONE, or ALREADY_DONE when a retire's answer was lost to a timeout on a loaded machine
    # and its retry found the grant gone (the grants left are checked below, as KMS lists them).
    retired = [r for o in first for r in o.actions if r.action == "grant" and r.ok]
    assert {r.status for r in retired} <= {ActionStatus.DONE, ActionStatus.ALREADY_DONE} and len(retired) == 400
    redelivered = [r for o in again for r in o.actions if r.action == "grant" and r.ok]
    assert {r.status for r in redelivered} == {ActionStatus.ALREADY_DONE} and len(redelivered) == 400
    assert stack.grant_ids() == {victims}
