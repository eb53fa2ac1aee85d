"""Security as tests: hostile prefixes delete nothing, secrets stay out of the logs, the role allows what is used."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from cleanup.telemetry import configure_logging
from tests.scenarios.helpers import (
    ProxiedClients,
    World,
    assert_final_state,
    deliver_like_lambda,
    new_ids,
    world,
)
from tests.stack import SessionStack, client
from worker import lambda_handler
from worker.local.backend import create_registry_table, join_room

__all__ = ["world"]

pytestmark = pytest.mark.timeout(60)
TEMPLATE = Path(__file__).resolve().parent.parent / "deploy" / "template.yaml"
TARGETS = ("sessions/t2/live/a", "sessions/t1/a", "other/t1/x/a", "sessions/keep", "sessions/t1x/c", "root-file")


@pytest.mark.parametrize(
    ("prefix", "tenant_scoped"),
    [
        ("sessions/t1/../t2/", False),
        ("sessions/t1/../../other/t1/x/", False),
        ("sessions//", False),
        ("sessions//t2/", False),
        ("/sessions/t2/", False),
        ("sessions/t1/%2e%2e/t2/", False),
        ("sessions/%2E%2E/other/", False),
        ("sessions/t1%2F..%2F..%2Fother/", False),
        ("sessions/./t2/", False),
        ("s3://elsewhere/sessions/t2/", False),
        ("s3:///sessions/t2/", False),
        ("https://elsewhere.s3.amazonaws.com/sessions/t2/", False),
        ("sessions/", False),
        ("", False),
        ("sessions", False),
        ("other/t1/x/", False),
        ("sessions/t2/live/", True),
    ],
)
def test_a_hostile_prefix_deletes_nothing_anywhere(stack: SessionStack, prefix: str, tenant_scoped: bool) -> None:
    elsewhere = f"{stack.bucket}-elsewhere"
    stack.s3.create_bucket(Bucket=elsewhere)
    for bucket in (stack.bucket, elsewhere):
        for key in TARGETS:
            stack.s3.put_object(Bucket=bucket, Key=key, Body=b"keep")
    stack.put_item({"pk": "session#hostile", "sk": "meta", "tenantId": "t1", "scratchPrefix": prefix})
    stack.delete("hostile")
    event = stack.lambda_event()
    with lambda_handler.warm.use(stack.runtime(scratch_tenant_scoped=tenant_scoped)):
        response = lambda_handler.handler(event, None)

    removed = [r["dynamodb"]["SequenceNumber"] for r in event["Records"] if r["eventName"] == "REMOVE"]
    assert response == {"batchItemFailures": [{"itemIdentifier": number} for number in removed]}
    for bucket in (stack.bucket, elsewhere):
        listed = stack.s3.list_objects_v2(Bucket=bucket).get("Contents", [])
        assert sorted(o["Key"] for o in listed) == sorted(TARGETS)


@pytest.fixture
def captured_log() -> io.StringIO:
    return io.StringIO()  # the worker's logger is restored after every test (tests/conftest.py)


@pytest.mark.slow  # a fault scenario
def test_grant_tokens_and_object_keys_never_reach_the_logs(world: World, captured_log: io.StringIO) -> None:
    stack = world.stack
    ended = world.make_sessions(new_ids(40, "end"), sockets=4, objects=2)
    for made in ended:  # the item carries its token, as an application might: it must still not be logged
        stack.ddb.update_item(
            TableName=stack.table,
            Key=stack.key(made.id),
            UpdateExpression="SET grantToken = :t",
            ExpressionAttributeValues={":t": {"S": made.grant_token}},
        )
    world.end(ended)
    runtime = world.runtime()
    configure_logging(runtime.settings, captured_log)
    world.plan.rate = 0.2  # failures are logged at WARNING with their errors: those must be clean too

    deliver_like_lambda(world.records(), world.invoker(runtime), batch_size=20)

    world.plan.enabled = False
    assert_final_state(world, deleted=ended, live=[])
    text = captured_log.getvalue()
    assert text.count('"record cleaned"') >= len(ended)
    leaked = [s for made in ended for s in (made.grant_token, *made.objects) if s in text]
    assert leaked == []


# Who calls what: the event source mapping reads the stream with the function's role (a DynamoDB stream, or a Kinesis
# data stream), and Lambda writes its logs.
# The role also runs the backlog's drain (every grant names it as retiring principal): what only the drain and its SQS
# mapping use, which this stream run does not (tests/test_drain.py runs the drain; tests/test_template.py scans it).
DRAIN_ONLY = {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility", "s3:GetObject"}
PLATFORM_ACTIONS = {
    # The AppConfig Lambda extension's, fetching the kill switch with the function's role (when one is configured).
    "appconfig:GetLatestConfiguration",
    "appconfig:StartConfigurationSession",
    "dynamodb:DescribeStream",
    "dynamodb:GetRecords",
    "dynamodb:GetShardIterator",
    "dynamodb:ListStreams",
    "kinesis:DescribeStream",
    "kinesis:DescribeStreamSummary",
    "kinesis:GetRecords",
    "kinesis:GetShardIterator",
    "kinesis:ListShards",
    "logs:CreateLogStream",
    "logs:PutLogEvents",
}
IAM_ACTIONS = {
    ("dynamodb", "GetItem"): {"dynamodb:GetItem"},
    ("dynamodb", "DescribeTable"): {"dynamodb:DescribeTable"},
    ("dynamodb", "Query"): {"dynamodb:Query"},
    ("dynamodb", "BatchWriteItem"): {"dynamodb:BatchWriteItem"},
    ("dynamodb", "BatchGetItem"): {"dynamodb:BatchGetItem"},
    ("kms", "RetireGrant"): {"kms:RetireGrant"},
    ("kms", "ListGrants"): {"kms:ListGrants"},  # SESSION_BINDING: the grant's name, before it is retired
    ("s3", "GetBucketVersioning"): {"s3:GetBucketVersioning"},
    ("s3", "ListObjectsV2"): {"s3:ListBucket"},
    ("s3", "ListObjectVersions"): {"s3:ListBucketVersions"},
    ("s3", "DeleteObjects"): set(),  # s3:DeleteObject, or s3:DeleteObjectVersion when deleting by VersionId
    ("s3", "DeleteObject"): set(),  # the same, for keys that cannot travel in DeleteObjects' XML
    ("sqs", "SendMessageBatch"): {"sqs:SendMessage"},
    ("sqs", "GetQueueAttributes"): {"sqs:GetQueueAttributes"},
    ("s3", "PutObject"): {"s3:PutObject"},
    ("apigatewaymanagementapi", "DeleteConnection"): {"execute-api:ManageConnections"},
}


class _CfnLoader(yaml.SafeLoader):
    """YAML with CloudFormation's short tags, each read as its long form (``!Ref x`` -> ``{"Ref": x}``)."""


def _tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    return {suffix if suffix == "Ref" else f"Fn::{suffix}": value}


_CfnLoader.add_multi_constructor("!", _tag)


def role_actions(role: str) -> set[str]:
    """Every action the role's inline policies allow (both branches of a condition)."""
    template = yaml.load(TEMPLATE.read_text(), Loader=_CfnLoader)  # a SafeLoader subclass
    actions: set[str] = set()
    for policy in template["Resources"][role]["Properties"]["Policies"]:
        for statement in policy["PolicyDocument"]["Statement"]:
            branches = statement["Fn::If"][1:] if "Fn::If" in statement else [statement]
            for branch in branches:
                if isinstance(branch, dict) and "Action" in branch:
                    action = branch["Action"]
                    actions.update([action] if isinstance(action, str) else action)
    return actions


def run_everything(world: World, *, versioned: bool) -> ProxiedClients:
    """A run that makes every kind of call: sockets, grants, objects, versioning asked, registry memberships, and two
    dead-lettered records, one of them too large for the queue's 4 KiB messages (stored in S3, in a bucket of its own
    here)."""
    stack = world.stack
    if versioned:
        stack.s3.put_bucket_versioning(Bucket=stack.bucket, VersioningConfiguration={"Status": "Enabled"})
    attributes = {"MaximumMessageSize": "4096"}
    queue_url = client("sqs").create_queue(QueueName=f"dlq-{stack.bucket}", Attributes=attributes)["QueueUrl"]
    stack.s3.create_bucket(Bucket=f"{stack.bucket}-dead-letters")
    ended = world.make_sessions(new_ids(6, "end"), sockets=2)
    registry = f"registry-{stack.table}"
    create_registry_table(stack.ddb, registry)
    connections = [made.socket.connection_id for made in ended if made.socket is not None]
    for connection_id in connections:
        join_room(stack.ddb, registry, "lobby", connection_id, user_id="u1", shard=0)
    stack.put_item({"pk": "session#bad", "sk": "meta", "tenantId": "t1", "scratchPrefix": "sessions/../x/"})
    big = {"pk": "session#big", "sk": "meta", "tenantId": "t1", "scratchPrefix": "sessions/../y/", "blob": "x" * 5000}
    stack.put_item(big)
    world.end(ended)
    stack.delete("bad")
    stack.delete("big")
    runtime = world.runtime(
        dead_letter_queue_url=queue_url, dead_letter_bucket=f"{stack.bucket}-dead-letters", registry_table=registry
    )
    assert world.invoker(runtime)({"Records": world.records()}) == {"batchItemFailures": []}
    assert stack.versions() == 0
    assert stack.ddb.scan(TableName=registry, ConsistentRead=True)["Count"] == 0 < len(connections)
    assert isinstance(runtime.clients, ProxiedClients)
    return runtime.clients


@pytest.mark.skipif(not TEMPLATE.exists(), reason="no deploy/template.yaml")
@pytest.mark.parametrize("versioned", [False, True], ids=["unversioned", "versioned"])
def test_the_cleanup_role_allows_exactly_what_the_worker_and_its_platform_call(world: World, versioned: bool) -> None:
    clients = run_everything(world, versioned=versioned)

    called = set(clients.operations)
    unknown = called - set(IAM_ACTIONS)
    assert unknown == set(), f"calls with no IAM mapping: {unknown}"
    used = {action for call in called for action in IAM_ACTIONS[call]}
    if called & {("s3", "DeleteObjects"), ("s3", "DeleteObject")}:
        used.add("s3:DeleteObjectVersion" if versioned else "s3:DeleteObject")
    allowed = role_actions("CleanupRole")
    assert used <= allowed, f"called but not allowed: {used - allowed}"
    # Everything allowed is used by one of the two runs (versioning decides which S3 actions).
    versioned_only = {"s3:ListBucketVersions", "s3:DeleteObjectVersion"}
    unversioned_only = {"s3:ListBucket", "s3:DeleteObject"}
    expected = allowed - PLATFORM_ACTIONS - (unversioned_only if versioned else versioned_only) - DRAIN_ONLY
    assert used == expected
