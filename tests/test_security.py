"""Security as tests: hostile prefixes delete nothing, secrets stay out of the logs, and each function's role allows
what that function is seen to call against the test backend (the action, and where: which queue, which bucket and
part of it), as the SAM-transformed template grants it."""

from __future__ import annotations

import io
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cleanup.deadline import Deadline
from cleanup.operations.reconcile import reconcile
from cleanup.queues.backlog import backlog_body
from cleanup.queues.deadletter import stored_letter
from cleanup.queues.integrity import seal
from cleanup.runtime import Runtime
from cleanup.telemetry import Metrics, configure_logging
from schemas.outcomes import Outcome, Status
from schemas.records import StreamRecord, read_record
from schemas.settings import Settings
from tests.scenarios.helpers import (
    ProxiedClients,
    World,
    assert_final_state,
    deliver_like_lambda,
    new_ids,
    world,
)
from tests.stack import SessionStack, client
from tests.test_reconcile import age, grant_dates, session
from tests.test_template import attached, for_mappings, granted_to_code, source_functions
from worker import backlog, lambda_handler
from worker.local.backend import create_registry_table, join_room

__all__ = ["grant_dates", "world"]

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
    ("kms", "GenerateMac"): {"kms:GenerateMac"},
    ("kms", "VerifyMac"): {"kms:VerifyMac"},
    ("sqs", "GetQueueUrl"): {"sqs:GetQueueUrl"},
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
    ("s3", "GetObject"): set(),  # s3:GetObject, or s3:GetObjectVersion when reading by VersionId
    ("s3", "HeadObject"): set(),  # the same
    ("sqs", "ChangeMessageVisibilityBatch"): {"sqs:ChangeMessageVisibility"},
    ("dynamodb", "Scan"): {"dynamodb:Scan"},
}


@dataclass(frozen=True)
class Request:
    """One AWS call as the worker made it: its parameters, and the HTTP status of the answer."""

    service: str
    operation: str
    params: dict[str, Any]
    status: int


class RecordingClients(ProxiedClients):
    """The runtime's clients, each request kept with its parameters and the status of its answer."""

    def __init__(self, settings: Settings, endpoint_url: str) -> None:
        super().__init__(settings, endpoint_url)
        self.recorded_settings = settings
        self.requests: list[Request] = []
        self._requests_lock = threading.Lock()

    def _create(self, service: str, endpoint_url: str | None, region: str | None = None) -> Any:
        created = super()._create(service, endpoint_url, region)
        created.meta.events.register("before-parameter-build", self._keep)
        created.meta.events.register("after-call", self._answered)
        return created

    def _keep(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["recorded"] = dict(params)

    def _answered(self, http_response: Any, model: Any, context: dict[str, Any], **_: Any) -> None:
        request = Request(model.service_model.service_name, model.name, context.get("recorded", {}), 0)
        with self._requests_lock:
            self.requests.append(Request(request.service, request.operation, request.params, http_response.status_code))


def recording_runtime(world: World, **overrides: Any) -> Runtime:
    """A runtime whose every request is recorded; no fault is injected here, so the fault world's 0.5 s read bound
    (meant to time out a delayed answer) gives way to a generous one: a loaded machine must not fail a call."""
    timeouts = {"http_timeout_seconds": 10.0, "bulk_timeout_seconds": 10.0, "botocore_max_attempts": 3}
    settings = world.settings(**{**timeouts, **overrides})
    runtime = Runtime(settings, RecordingClients(settings, world.aws_proxy.url), Metrics(settings, world.sink))
    world.runtimes.append(runtime)
    return runtime


def s3_where(settings: Settings, bucket: str, key: str | None) -> str:
    """Which part of which bucket a request names: stored records, scratch data, or either bucket itself."""
    stored = bucket == settings.dead_letter_store
    if key is None:
        return "scratch-bucket" if bucket == settings.scratch_bucket else "stored-bucket" if stored else "elsewhere"
    if stored and key.startswith(settings.dead_letter_prefix):
        return "stored"
    return "scratch" if bucket == settings.scratch_bucket and key.startswith(settings.scratch_root) else "elsewhere"


def needed(request: Request, settings: Settings) -> set[tuple[str, str]]:
    """The IAM actions a request needs, each with where it needs it."""
    params, op = request.params, request.operation
    if request.service == "sqs":
        queues = {settings.dead_letter_queue_url: "DeadLetterQueue", settings.backlog_queue_url: "BacklogQueue"}
        return {(action, queues.get(params["QueueUrl"], "elsewhere")) for action in IAM_ACTIONS[("sqs", op)]}
    if request.service != "s3":
        return {(action, "elsewhere") for action in IAM_ACTIONS[(request.service, op)]}
    bucket = params["Bucket"]
    if op == "DeleteObjects":
        objects = params["Delete"]["Objects"]
        return {
            (f"s3:DeleteObject{'Version' if 'VersionId' in o else ''}", s3_where(settings, bucket, o["Key"]))
            for o in objects
        }
    if op in ("GetObject", "HeadObject", "DeleteObject"):
        verb = "Delete" if op == "DeleteObject" else "Get"
        action = f"s3:{verb}Object{'Version' if params.get('VersionId') else ''}"
        found = {(action, s3_where(settings, bucket, params["Key"]))}
        # A missing object is a 404 only to whoever may list the bucket (403 otherwise).
        return found | ({("s3:ListBucket", s3_where(settings, bucket, None))} if request.status == 404 else set())
    prefix = params.get("Prefix") if op in ("ListObjectsV2", "ListObjectVersions") else params.get("Key")
    return {(action, s3_where(settings, bucket, prefix)) for action in IAM_ACTIONS[("s3", op)]}


def where_granted(statement: dict[str, Any]) -> str:
    """Where a statement's resource is, in the terms of ``needed``."""
    text = json.dumps(statement["Resource"])
    if "${DeadLetterPrefix}" in text:
        return "stored"
    if "${ScratchRoot}" in text or "${ScratchRoot}" in json.dumps(statement.get("Condition", {})):
        return "scratch"
    if "DeadLetterBucket" in text:
        return "stored-bucket"
    if "ScratchBucket" in text:
        return "scratch-bucket"
    queues = [q for q in ("DeadLetterQueue", "OnFailureQueue", "BacklogQueue") if f'["{q}", "Arn"]' in text]
    return queues[0] if queues else "elsewhere"


def granted_where(function: str) -> set[tuple[str, str]]:
    """What the code of ``function`` may call, and where (its mappings' statements left out: no code makes those)."""
    arn = {"Fn::GetAtt": [function, "Arn"]}
    return {
        (action, where_granted(statement))
        for statement in attached("CleanupRole", HasRegistry=True, AskVersioning=True)
        if not for_mappings(statement) and arn in (source_functions(statement) or [arn])
        for action in ([statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"])
    }


def run_everything(world: World, *, versioned: bool) -> RecordingClients:
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
    connections = [(made.socket.connection_id, made.id) for made in ended if made.socket is not None]
    for connection_id, sid in connections:
        join_room(stack.ddb, registry, "lobby", connection_id, user_id="u1", shard=0, session_id=sid)
    stack.put_item({"pk": "session#bad", "sk": "meta", "tenantId": "t1", "scratchPrefix": "sessions/../x/"})
    big = {"pk": "session#big", "sk": "meta", "tenantId": "x" * 5000, "scratchPrefix": "sessions/../y/"}
    stack.put_item(big)
    world.end(ended)
    stack.delete("bad")
    stack.delete("big")
    runtime = recording_runtime(
        world,
        dead_letter_queue_url=queue_url,
        dead_letter_bucket=f"{stack.bucket}-dead-letters",
        registry_table=registry,
    )
    assert world.invoker(runtime)({"Records": world.records()}) == {"batchItemFailures": []}
    assert stack.versions() == 0
    assert stack.ddb.scan(TableName=registry, ConsistentRead=True)["Count"] == 0 < len(connections)
    assert isinstance(runtime.clients, RecordingClients)
    return runtime.clients


@pytest.mark.parametrize("versioned", [False, True], ids=["unversioned", "versioned"])
def test_the_cleanup_role_allows_exactly_what_the_worker_and_its_platform_call(world: World, versioned: bool) -> None:
    clients = run_everything(world, versioned=versioned)

    called = set(clients.operations)
    unknown = called - set(IAM_ACTIONS)
    assert unknown == set(), f"calls with no IAM mapping: {unknown}"
    used = {action for call in called for action in IAM_ACTIONS[call]}
    if called & {("s3", "DeleteObjects"), ("s3", "DeleteObject")}:
        used.add("s3:DeleteObjectVersion" if versioned else "s3:DeleteObject")
    allowed = granted_to_code("CleanupFunction")
    assert used <= allowed, f"called but not allowed: {used - allowed}"
    # Everything allowed is used by one of the two runs (versioning decides which S3 actions).
    versioned_only = {"s3:ListBucketVersions", "s3:DeleteObjectVersion"}
    unversioned_only = {"s3:ListBucket", "s3:DeleteObject"}
    expected = allowed - PLATFORM_ACTIONS - (unversioned_only if versioned else versioned_only)
    assert used == expected
    # And each where the template allows it: a dead letter stored under its prefix, a scratch object under the root.
    where = {need for request in clients.requests for need in needed(request, clients.recorded_settings)}
    assert where - granted_where("CleanupFunction") == set()
    assert ("s3:PutObject", "stored") in where


def deferred_bodies(stack: SessionStack) -> list[str]:
    """The backlog message of each new REMOVE record, as the stream's function defers it (every action left)."""
    bodies = []
    for raw in stack.new_records():
        record = read_record(raw)
        if isinstance(record, StreamRecord) and raw["eventName"] == "REMOVE":
            outcome = Outcome(sequence_number=record.sequence_number, status=Status.DEFERRED, error="no turn")
            bodies.append(backlog_body(outcome, record))
    return bodies


def received(queue_url: str, *bodies: str) -> list[dict[str, Any]]:
    """``bodies`` sent to the queue and received, as Lambda's SQS mapping hands them to the drain."""
    sqs = client("sqs")
    for body in bodies:
        sqs.send_message(QueueUrl=queue_url, MessageBody=body)
    answer = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, AttributeNames=["All"])
    messages = answer.get("Messages", [])
    assert len(messages) == len(bodies)
    return [
        {
            "messageId": m["MessageId"],
            "receiptHandle": m["ReceiptHandle"],
            "body": m["Body"],
            "attributes": m["Attributes"],
        }
        for m in messages
    ]


def test_the_drain_is_allowed_every_call_it_makes_where_it_makes_it(world: World) -> None:
    stack = world.stack
    stored_bucket = f"{stack.bucket}-dead-letters"
    stack.s3.create_bucket(Bucket=stored_bucket)
    stack.s3.put_bucket_versioning(Bucket=stored_bucket, VersioningConfiguration={"Status": "Enabled"})
    sqs = client("sqs")
    queues = {name: sqs.create_queue(QueueName=f"{name}-{stack.bucket}")["QueueUrl"] for name in ("backlog", "dlq")}
    overrides = {"dead_letter_bucket": stored_bucket, "dead_letter_queue_url": queues["dlq"]}
    runtime = recording_runtime(world, backlog_queue_url=queues["backlog"], **overrides)
    refused = recording_runtime(
        world, backlog_queue_url=queues["backlog"], kms_key_id=stack.key_arn[:-4] + "0000", **overrides
    )
    world.end(world.make_sessions(new_ids(3, "drain"), sockets=1))
    big, small, later = deferred_bodies(stack)
    small, later = seal(small, runtime), seal(later, runtime)  # as the stream's function sends them: tagged
    letter = stored_letter(0, big, runtime, limit=len(big) - 1, deadline=Deadline.after(10))
    assert letter is not None and letter.stored

    first = backlog.drain(received(queues["backlog"], letter.body, small), runtime, Deadline.after(60))
    duplicate = backlog.drain(received(queues["backlog"], letter.body), runtime, Deadline.after(60))
    [waiting] = received(queues["backlog"], later)
    released = backlog.drain([waiting], refused, Deadline.after(60))

    assert (first, duplicate) == ({"batchItemFailures": []}, {"batchItemFailures": []})
    assert released == {"batchItemFailures": [{"itemIdentifier": waiting["messageId"]}]}
    versions = stack.s3.list_object_versions(Bucket=stored_bucket, Prefix=letter.stored).get("Versions", [])
    assert [v for v in versions if v["Key"] == letter.stored] == []  # the stored record's very version is gone
    where = set()
    for used in (runtime, refused):
        assert isinstance(used.clients, RecordingClients)
        where |= {need for request in used.clients.requests for need in needed(request, used.settings)}
    assert {("s3:GetObjectVersion", "stored"), ("s3:ListBucket", "stored-bucket")} <= where  # read by version; a 404
    assert ("sqs:ChangeMessageVisibility", "BacklogQueue") in where
    assert where - granted_where("DrainFunction") == set()


def test_the_reconciler_is_allowed_every_call_it_makes_where_it_makes_it(
    world: World, grant_dates: dict[str, float]
) -> None:
    stack = world.stack
    grant_id = session(stack, "gone-r")
    stack.delete("gone-r")  # behind the stream's back: only reconcile frees its grant and its scratch data
    age(stack, "sessions/t1/gone-r/")
    runtime = recording_runtime(world, scratch_tenant_scoped=True, reconcile_scratch=True, session_sort_key="meta")

    report = reconcile(runtime)

    assert report.ok and grant_id not in stack.grant_ids() and stack.objects("sessions/t1/gone-r/") == []
    assert isinstance(runtime.clients, RecordingClients)
    where = {need for request in runtime.clients.requests for need in needed(request, runtime.settings)}
    assert {("kms:ListGrants", "elsewhere"), ("s3:ListBucket", "scratch")} <= where
    assert where - granted_where("ReconcilerFunction") == set()
