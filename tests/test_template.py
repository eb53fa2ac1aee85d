"""deploy/template.yaml: it lints, the SAM transform resolves it, and it says what the worker needs and nothing more.

The IAM tests compare the policies with the AWS calls found in the functions' own source, so a new call without its
permission (or a permission no code uses any more) fails here rather than in an account.
"""

from __future__ import annotations

import ast
import copy
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import boto3
import botocore.session
import pytest
from botocore import xform_name
from cfnlint.api import lint_file
from cfnlint.decode import decode
from samtranslator.parser.parser import Parser
from samtranslator.translator.translator import Translator

from cleanup.expiry.sweeper import Verdict
from cleanup.telemetry import ROLLED_UP
from schemas.settings import AttributeNames, CleanupMode, Settings

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "deploy" / "template.yaml"
EXAMPLE_TABLE = ROOT / "deploy" / "session-table.yaml"
PACKAGES = ("cleanup", "schemas", "worker")

# boto3 method -> the IAM actions it needs. DeleteObjects and DeleteObject check DeleteObject (and DeleteObjectVersion
# for versions);
# SendMessageBatch checks sqs:SendMessage; the Management API's DeleteConnection is execute-api:ManageConnections.
IAM_ACTIONS: dict[str, set[str]] = {
    "get_item": {"dynamodb:GetItem"},
    "batch_get_item": {"dynamodb:BatchGetItem"},
    "query": {"dynamodb:Query"},
    "scan": {"dynamodb:Scan"},
    "batch_write_item": {"dynamodb:BatchWriteItem"},
    "describe_table": {"dynamodb:DescribeTable"},
    "delete_item": {"dynamodb:DeleteItem"},
    "list_objects_v2": {"s3:ListBucket"},
    "list_object_versions": {"s3:ListBucketVersions"},
    "delete_objects": {"s3:DeleteObject", "s3:DeleteObjectVersion"},
    "delete_object": {"s3:DeleteObject", "s3:DeleteObjectVersion"},
    "get_bucket_versioning": {"s3:GetBucketVersioning"},
    "retire_grant": {"kms:RetireGrant"},
    "list_grants": {"kms:ListGrants"},
    "delete_connection": {"execute-api:ManageConnections"},
    "send_message_batch": {"sqs:SendMessage"},
    "send_message": {"sqs:SendMessage"},
    "get_queue_url": {"sqs:GetQueueUrl"},
    "generate_mac": {"kms:GenerateMac"},
    "verify_mac": {"kms:VerifyMac"},
    "get_queue_attributes": {"sqs:GetQueueAttributes"},
    "put_object": {"s3:PutObject"},
    "get_object": {"s3:GetObject", "s3:GetObjectVersion"},  # a stored record is read by its version
    "head_object": {"s3:GetObject"},
    "change_message_visibility_batch": {"sqs:ChangeMessageVisibility"},
}
# What Lambda itself does with the function's role: write its logs; for the cleanup function also read the stream
# for the event source mapping, and send failed batches' metadata to the on-failure queue (sqs:SendMessage).
LOGS = {"logs:CreateLogStream", "logs:PutLogEvents"}
STREAM_READ = {"dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator", "dynamodb:ListStreams"}
# Or, on a Kinesis data stream (Kinesis Data Streams for DynamoDB), what Lambda's polling needs.
KINESIS_READ = {
    "kinesis:DescribeStream",
    "kinesis:DescribeStreamSummary",
    "kinesis:GetRecords",
    "kinesis:GetShardIterator",
    "kinesis:ListShards",
}
# The template's conditions as a full deployment on a DynamoDB stream has them; a test names those it changes.
# What Lambda's SQS event source mapping does with the drain's role (the cleanup role) on the backlog queue.
SQS_MAPPING = {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"}
# And what Lambda sends to the on-failure queue for the stream's mapping.
ON_FAILURE = {"sqs:SendMessage"}
CONDITIONS = {
    "ConnectionOn": True,
    "GrantOn": True,
    "ScratchOn": True,
    "MessagesOn": True,
    "HasKmsKey": True,
    "CreateKillSwitchOn": False,
    "AskVersioning": True,
    "KinesisSource": False,
    "HasRegistry": True,
    "HasKillSwitch": False,
    "ReconcileOtherKeys": False,
    "BindingOn": True,
    "HasPreviousIntegrityKeys": False,
}
CLIENT_SERVICES = ("dynamodb", "s3", "kms", "sqs", "apigatewaymanagementapi")


@cache
def source_template() -> dict[str, Any]:
    template, problems = decode(str(TEMPLATE))
    assert not problems, problems
    return json.loads(json.dumps(template))


@cache
def transformed() -> dict[str, Any]:
    """The template as CloudFormation runs it after the SAM transform (CodeUri as `sam package` leaves it)."""
    template = copy.deepcopy(source_template())
    template["Globals"]["Function"]["CodeUri"] = "s3://artifacts/functions.zip"
    template["Resources"]["RuntimeLayer"]["Properties"]["ContentUri"] = "s3://artifacts/session-cleanup.zip"
    translator = Translator(None, Parser(), boto_session=boto3.session.Session(region_name="us-east-1"))
    result: dict[str, Any] = translator.translate(template, parameter_values={}, get_managed_policy_map=lambda: {})
    return result


def resources(kind: str) -> dict[str, dict[str, Any]]:
    return {name: r for name, r in transformed()["Resources"].items() if r["Type"] == kind}


def function(handler: str) -> dict[str, Any]:
    """The function whose handler this is."""
    [found] = [f for f in resources("AWS::Lambda::Function").values() if f["Properties"]["Handler"] == handler]
    return found


def stream_mapping() -> dict[str, Any]:
    [found] = [
        m
        for m in resources("AWS::Lambda::EventSourceMapping").values()
        if m["Properties"]["EventSourceArn"] == {"Ref": "SessionTableStreamArn"}
    ]
    return found


def parameter(name: str) -> dict[str, Any]:
    definition: dict[str, Any] = source_template()["Parameters"][name]
    return definition


NO_VALUE = {"Ref": "AWS::NoValue"}


def resolved(node: Any, **conditions: bool) -> Any:
    """``node`` with every ``Fn::If`` on one of ``CONDITIONS`` decided as they (updated with ``conditions``) say."""
    decided = {**CONDITIONS, **conditions}
    if isinstance(node, dict) and set(node) == {"Fn::If"} and node["Fn::If"][0] in decided:
        condition, when_true, when_false = node["Fn::If"]
        return resolved(when_true if decided[condition] else when_false, **conditions)
    if isinstance(node, dict):
        kept = {key: resolved(value, **conditions) for key, value in node.items()}
        return {key: value for key, value in kept.items() if value != NO_VALUE or key == "Ref"}
    if isinstance(node, list):
        return [resolved(value, **conditions) for value in node if resolved(value, **conditions) != NO_VALUE]
    return node


def statements(role: str, **conditions: bool) -> list[dict[str, Any]]:
    """The statements of a role's inline policies, or of a policy resource (``AWS::IAM::Policy``)."""
    properties = transformed()["Resources"][role]["Properties"]
    found = []
    for policy in properties.get("Policies", [properties] if "PolicyDocument" in properties else []):
        found += resolved(policy["PolicyDocument"]["Statement"], **conditions)
    return found


def granted(role: str, **conditions: bool) -> set[str]:
    return {action for s in statements(role, **conditions) for action in as_list(s["Action"])}


def attached(role: str, **conditions: bool) -> list[dict[str, Any]]:
    """The statements of the role's inline policies and of every policy resource attached to it."""
    policies = [name for name, p in resources("AWS::IAM::Policy").items() if {"Ref": role} in p["Properties"]["Roles"]]
    return [s for name in [role, *policies] for s in statements(name, **conditions)]


def by_sid(role: str, **conditions: bool) -> dict[str, dict[str, Any]]:
    """The role's statements by Sid (of a Sid in two policies, the last; tests read the reconciler's apart)."""
    return {statement["Sid"]: statement for statement in attached(role, **conditions)}


def source_functions(statement: dict[str, Any]) -> list[Any] | None:
    """The functions a statement is bound to (``lambda:SourceFunctionArn``), None when it is not."""
    arns = statement.get("Condition", {}).get("ArnLike", {}).get("lambda:SourceFunctionArn")
    return None if arns is None else as_list(arns)


def for_mappings(statement: dict[str, Any]) -> bool:
    """Allowed only to requests with no source function: Lambda's own, for an event source mapping."""
    return statement.get("Condition", {}).get("Null") == {"lambda:SourceFunctionArn": "true"}


def granted_to_code(function: str, role: str = "CleanupRole", **conditions: bool) -> set[str]:
    """What the code of ``function`` (a logical id) may call with its role: the statements bound to it, and those bound
    to no function and not kept for mappings (its logs, the kill switch)."""
    arn = {"Fn::GetAtt": [function, "Arn"]}
    return {
        action
        for s in attached(role, **conditions)
        if not for_mappings(s) and (source_functions(s) is None or arn in (source_functions(s) or []))
        for action in as_list(s["Action"])
    }


def granted_to_mappings(role: str = "CleanupRole", **conditions: bool) -> set[str]:
    return {action for s in attached(role, **conditions) if for_mappings(s) for action in as_list(s["Action"])}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def module_files(module: str) -> list[Path]:
    """``module`` and every module of this project it imports, transitively."""
    seen: dict[str, Path] = {}
    pending = [module]
    while pending:
        name = pending.pop()
        path = module_path(name)
        if name in seen or path is None:
            continue
        seen[name] = path
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                pending += [alias.name for alias in node.names if alias.name.split(".")[0] in PACKAGES]
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
                pending += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return list(seen.values())


def module_path(module: str) -> Path | None:
    """The file of one of this project's modules, or None for a name that is not a module (an imported object)."""
    base = ROOT / module.replace(".", "/")
    return next((path for path in (base.with_suffix(".py"), base / "__init__.py") if path.exists()), None)


def aws_calls(files: list[Path]) -> set[str]:
    """boto3 client methods named in ``files``: called or passed (``s3.delete_objects``), or as a paginator name."""
    text = "\n".join(path.read_text() for path in files)
    session = botocore.session.get_session()
    methods = {xform_name(op) for s in CLIENT_SERVICES for op in session.get_service_model(s).operation_names}
    return {m for m in methods if re.search(rf"\.{m}\b|[\"']{m}[\"']", text)}


@pytest.mark.parametrize("template", [TEMPLATE, EXAMPLE_TABLE], ids=lambda path: path.name)
def test_cfn_lint_passes(template: Path) -> None:
    assert [str(match) for match in lint_file(template)] == []


def test_the_example_table_has_what_the_worker_and_the_sweeper_read() -> None:
    table, problems = decode(str(EXAMPLE_TABLE))
    assert not problems, problems
    props = table["Resources"]["SessionTable"]["Properties"]
    names = Settings().attributes
    [index] = props["GlobalSecondaryIndexes"]

    assert props["StreamSpecification"]["StreamViewType"] == "NEW_AND_OLD_IMAGES"
    assert props["TimeToLiveSpecification"] == {"AttributeName": names.ttl, "Enabled": True}
    assert [k["AttributeName"] for k in props["KeySchema"]] == [names.pk, names.sk]
    assert [k["AttributeName"] for k in index["KeySchema"]] == [names.expiry_bucket, names.ttl]
    assert table["Parameters"]["ExpiryIndexName"]["Default"] == "expiry-index"


def test_the_sam_transform_resolves_both_functions() -> None:
    functions = resources("AWS::Lambda::Function")

    assert {f["Properties"]["Handler"] for f in functions.values()} == {
        "worker.lambda_handler.handler",
        "worker.sweep.handler",
        "worker.backlog.handler",
        "worker.reconcile.handler",
        "worker.stream_check.handler",
        "worker.canary.handler",
    }
    for function in functions.values():
        assert function["Properties"]["Runtime"] == "python3.12"
        assert function["Properties"]["Architectures"] == ["arm64"]


def test_the_mapping_reports_failures_bisects_and_gives_up_in_finite_time() -> None:
    props = stream_mapping()["Properties"]

    assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert props["BisectBatchOnFunctionError"] is True
    assert props["MaximumRetryAttempts"] == {"Ref": "MaximumRetryAttempts"}
    assert parameter("MaximumRetryAttempts")["MinValue"] >= 0  # -1 would retry until the record expires
    assert props["MaximumRecordAgeInSeconds"] == {"Ref": "MaximumRecordAgeInSeconds"}
    assert parameter("MaximumRecordAgeInSeconds")["MinValue"] == -1  # -1: no limit; else 60 or more
    assert props["DestinationConfig"]["OnFailure"]["Destination"] == {"Fn::GetAtt": ["OnFailureQueue", "Arn"]}
    assert props["EventSourceArn"] == {"Ref": "SessionTableStreamArn"}
    for name in ("BatchSize", "ParallelizationFactor", "MaximumBatchingWindowInSeconds"):
        assert props[name] == {"Ref": name}


def test_the_mapping_delivers_only_remove_events() -> None:
    [only] = resolved(stream_mapping()["Properties"]["FilterCriteria"]["Filters"])

    assert json.loads(only["Pattern"]) == {"eventName": ["REMOVE"]}


def test_on_a_kinesis_stream_the_mapping_filters_the_session_tables_removes_in_the_records_data() -> None:
    cleanup = function("worker.lambda_handler.handler")

    [only] = resolved(stream_mapping()["Properties"]["FilterCriteria"]["Filters"], KinesisSource=True)

    pattern = only["Pattern"]["Fn::Sub"]
    assert json.loads(pattern) == {"data": {"eventName": ["REMOVE"], "tableName": ["${SessionTableName}"]}}
    assert cleanup["Properties"]["Environment"]["Variables"]["SESSION_TABLE"] == {"Ref": "SessionTableName"}


@pytest.mark.parametrize(
    ("arn", "kinesis"),
    [
        ("arn:aws:dynamodb:eu-west-1:123456789012:table/sessions/stream/2026-01-01T00:00:00.000", False),
        ("arn:aws:kinesis:eu-west-1:123456789012:stream/session-changes", True),
        ("arn:aws-cn:kinesis:cn-north-1:123456789012:stream/session-changes", True),
    ],
)
def test_the_source_parameter_takes_either_kind_of_stream_and_the_condition_tells_them_apart(
    arn: str, kinesis: bool
) -> None:
    pattern = parameter("SessionTableStreamArn")["AllowedPattern"]
    [field, value] = source_template()["Conditions"]["KinesisSource"]["Fn::Equals"]
    index, split = field["Fn::Select"]
    separator, source = split["Fn::Split"]

    assert source == {"Ref": "SessionTableStreamArn"}
    assert re.fullmatch(pattern, arn)
    assert (arn.split(separator)[index] == value) is kinesis


def test_every_environment_variable_is_a_setting() -> None:
    fields = {name.upper() for name in Settings.model_fields} | {"SERVICE_NAME"}
    fields |= {f"ATTR_{name.upper()}" for name in AttributeNames.model_fields}
    for function in resources("AWS::Lambda::Function").values():
        variables = set(function["Properties"]["Environment"]["Variables"])
        assert variables <= fields, variables - fields


def test_the_rollout_switch_defaults_to_dry_run_for_both_functions() -> None:
    assert parameter("CleanupMode")["AllowedValues"] == sorted(mode.value for mode in CleanupMode)
    assert parameter("CleanupMode")["Default"] == CleanupMode.DRY_RUN.value
    for function in resources("AWS::Lambda::Function").values():
        assert function["Properties"]["Environment"]["Variables"]["CLEANUP_MODE"] == {"Ref": "CleanupMode"}


@pytest.mark.parametrize("kinesis", [False, True], ids=["dynamodb-stream", "kinesis-stream"])
def test_no_policy_has_a_wildcard_action_or_an_unexplained_star_resource(kinesis: bool) -> None:
    text = TEMPLATE.read_text()
    for role in resources("AWS::IAM::Role"):
        for statement in attached(role, KinesisSource=kinesis):
            assert not any("*" in action for action in as_list(statement["Action"])), statement
            if "*" in as_list(statement["Resource"]):
                # The only accepted form: a comment naming the statement and why AWS requires "*".
                assert re.search(rf'#.*Resource "\*" for {statement["Sid"]}: \S', text), statement


def cleanup_role_calls() -> set[str]:
    """What both functions of the cleanup role call: the stream's and the backlog's drain."""
    return aws_calls(module_files("worker.lambda_handler") + module_files("worker.backlog"))


@pytest.mark.parametrize(
    ("function", "entry_point"),
    [("CleanupFunction", "worker.lambda_handler"), ("DrainFunction", "worker.backlog")],
    ids=["stream", "drain"],
)
def test_each_function_of_the_cleanup_role_may_call_exactly_what_its_code_calls(
    function: str, entry_point: str
) -> None:
    calls = aws_calls(module_files(entry_point))
    assert calls <= set(IAM_ACTIONS), f"add these calls to IAM_ACTIONS and the policy: {calls - set(IAM_ACTIONS)}"

    needed = {action for call in calls for action in IAM_ACTIONS[call]} | LOGS

    assert granted_to_code(function) == needed


def test_the_cleanup_role_grants_exactly_what_the_worker_calls() -> None:
    calls = cleanup_role_calls()
    needed = {action for call in calls for action in IAM_ACTIONS[call]} | LOGS | STREAM_READ | SQS_MAPPING

    assert (
        granted("CleanupRole") | {a for p in ("CleanSessionsPolicy", "StreamPolicy", "DrainPolicy") for a in granted(p)}
        == needed
    )
    assert granted_to_mappings() == STREAM_READ | SQS_MAPPING | ON_FAILURE


def test_on_a_kinesis_stream_the_cleanup_role_reads_that_stream_instead() -> None:
    by_sid_kinesis = by_sid("CleanupRole", KinesisSource=True)

    assert granted_to_mappings(KinesisSource=True) == KINESIS_READ | SQS_MAPPING | ON_FAILURE
    assert by_sid_kinesis["ReadKinesisStream"]["Resource"] == {"Ref": "SessionTableStreamArn"}


def test_the_registry_is_queried_and_pruned_only_when_one_is_configured() -> None:
    sids = by_sid("CleanupRole")
    cleanup = function("worker.lambda_handler.handler")
    variables = cleanup["Properties"]["Environment"]["Variables"]

    assert granted_to_code("CleanupFunction") - granted_to_code("CleanupFunction", HasRegistry=False) == {
        "dynamodb:Query",
        "dynamodb:BatchWriteItem",
        "dynamodb:DescribeTable",
    }
    assert sids["QueryRegistryIndex"]["Resource"]["Fn::Sub"].endswith(
        ":table/${RegistryTableName}/index/${RegistryConnectionIndex}"
    )
    assert sids["PruneRegistry"]["Resource"]["Fn::Sub"].endswith(":table/${RegistryTableName}")
    assert resolved(variables["REGISTRY_TABLE"], HasRegistry=False) == NO_VALUE
    assert parameter("RegistryConnectionIndex")["Default"] == Settings().registry_connection_index
    assert parameter("RegistryConnectionAttribute")["Default"] == AttributeNames().registry_connection_id


def test_the_sweeper_role_grants_exactly_what_the_sweeper_calls() -> None:
    calls = aws_calls([ROOT / "worker" / "sweep.py", ROOT / "cleanup" / "expiry" / "sweeper.py"])

    needed = {action for call in calls for action in IAM_ACTIONS[call]} | LOGS

    assert granted("SweeperRole") == needed


def test_the_sweeper_queries_only_the_expiry_index_every_minute() -> None:
    [query] = [s for s in statements("SweeperRole") if s["Action"] == "dynamodb:Query"]
    [rule] = [rule for rule in resources("AWS::Events::Rule").values() if "SweeperFunction" in json.dumps(rule)]

    assert query["Resource"]["Fn::Sub"].endswith(":table/${SessionTableName}/index/${ExpiryIndexName}")
    assert rule["Properties"]["ScheduleExpression"] == "rate(1 minute)"


def test_the_sweeper_is_off_unless_its_index_is_named() -> None:
    on = source_template()["Conditions"]["SweeperOn"]

    assert parameter("ExpiryIndexName")["Default"] == "" and Settings().expiry_index is None
    assert {"Fn::Not": [{"Fn::Equals": [{"Ref": "ExpiryIndexName"}, ""]}]} in on["Fn::And"]


def test_deletes_and_listings_are_confined_to_the_scratch_root() -> None:
    by_sid = {s["Sid"]: s for s in attached("CleanupRole")}

    assert by_sid["DeleteUnderScratchRoot"]["Resource"]["Fn::Sub"][0].endswith(":::${Bucket}/${ScratchRoot}*")
    assert by_sid["ListScratchRoot"]["Condition"]["StringLike"] == {"s3:prefix": {"Fn::Sub": "${ScratchRoot}*"}}
    assert by_sid["CloseConnection"]["Resource"]["Fn::Sub"].endswith(
        ":${WebSocketApiId}/${WebSocketStage}/DELETE/@connections/*"
    )
    assert by_sid["RetireGrant"]["Resource"] == {"Ref": "KmsKeyArn"}


def test_the_created_bucket_has_the_lifecycle_backstop_on_the_scratch_root() -> None:
    bucket = transformed()["Resources"]["ScratchBucket"]
    every = bucket["Properties"]["LifecycleConfiguration"]["Rules"]
    rules = [rule for rule in every if rule["Prefix"] == {"Ref": "ScratchRoot"}]

    assert bucket["Condition"] == "CreateScratchBucket"
    assert len(rules) == 2 and all(rule["Status"] == "Enabled" for rule in rules)
    assert any("ExpirationInDays" in rule for rule in rules)
    assert any("NoncurrentVersionExpiration" in rule for rule in rules)
    assert any(rule.get("ExpiredObjectDeleteMarker") is True for rule in rules)


@pytest.mark.parametrize("metric", ["RecordsFailed", "RecordsDeadLettered"])
def test_failure_alarms_watch_the_workers_own_metrics(metric: str) -> None:
    [alarm] = [a for a in resources("AWS::CloudWatch::Alarm").values() if a["Properties"].get("MetricName") == metric]

    assert alarm["Properties"]["Namespace"] == {"Ref": "MetricsNamespace"}
    assert alarm["Properties"]["Dimensions"] == [{"Name": "Service", "Value": {"Ref": "ServiceName"}}]
    assert parameter("MetricsNamespace")["Default"] == Settings().metrics_namespace
    assert parameter("ServiceName")["Default"] == Settings().service_name


def test_the_action_failures_alarm_counts_every_action_kind_not_named_ones() -> None:
    # http-close and any installed kind fail under names no list in the template can know: the alarm watches the
    # metric without its Action dimension, which the worker emits beside each action's own (ROLLED_UP).
    alarm = transformed()["Resources"]["ActionFailuresAlarm"]["Properties"]

    assert "Metrics" not in alarm and alarm["MetricName"] == "ActionFailures"
    assert alarm["Namespace"] == {"Ref": "MetricsNamespace"}
    assert alarm["Dimensions"] == [{"Name": "Service", "Value": {"Ref": "ServiceName"}}]
    assert "ActionFailures" in ROLLED_UP


def test_the_sweep_failures_alarm_watches_metrics_the_sweeper_emits() -> None:
    alarm = transformed()["Resources"]["SweepFailuresAlarm"]["Properties"]
    stats = [m["MetricStat"]["Metric"] for m in alarm["Metrics"] if "MetricStat" in m]
    sweeper_source = (ROOT / "cleanup" / "expiry" / "sweeper.py").read_text()

    for stat in stats:
        assert f'"{stat["MetricName"]}"' in sweeper_source
        assert stat["Namespace"] == {"Ref": "MetricsNamespace"}
    assert {d["Value"] for s in stats for d in s["Dimensions"] if d["Name"] == "Verdict"} <= {v.value for v in Verdict}


def test_the_stream_and_the_function_have_alarms() -> None:
    alarms = [alarm["Properties"] for alarm in resources("AWS::CloudWatch::Alarm").values()]
    lambda_alarms = [alarm for alarm in alarms if alarm.get("Namespace") == "AWS/Lambda"]
    on_cleanup = {a["MetricName"] for a in lambda_alarms if a["Dimensions"][0]["Value"] == {"Ref": "CleanupFunction"}}

    assert on_cleanup == {"Errors", "IteratorAge"}


def test_large_dead_letters_are_written_only_under_their_prefix_and_the_queue_size_is_set() -> None:
    by_sid = {s["Sid"]: s for s in attached("CleanupRole")}
    queue = transformed()["Resources"]["DeadLetterQueue"]["Properties"]
    cleanup = function("worker.lambda_handler.handler")

    assert by_sid["StoreLargeDeadLetters"]["Action"] == "s3:PutObject"
    assert by_sid["StoreLargeDeadLetters"]["Resource"]["Fn::Sub"][0].endswith(":::${Bucket}/${DeadLetterPrefix}*")
    assert by_sid["DeadLetters"]["Action"] == ["sqs:SendMessage", "sqs:GetQueueAttributes"]
    assert by_sid["DeadLetters"]["Resource"] == {"Fn::GetAtt": ["DeadLetterQueue", "Arn"]}
    assert queue["MaximumMessageSize"] == 1_048_576
    assert cleanup["Properties"]["Environment"]["Variables"]["DEAD_LETTER_PREFIX"] == {"Ref": "DeadLetterPrefix"}
    assert parameter("DeadLetterPrefix")["Default"] == Settings().dead_letter_prefix
    assert not Settings().dead_letter_prefix.startswith(parameter("ScratchRoot")["Default"])


def test_stored_dead_letters_expire_only_after_every_message_that_can_name_them() -> None:
    rules = resources("AWS::S3::Bucket")["ScratchBucket"]["Properties"]["LifecycleConfiguration"]["Rules"]
    queues = resources("AWS::SQS::Queue")
    [rule] = [r for r in rules if r.get("Prefix") == {"Ref": "DeadLetterPrefix"}]
    longest = max(int(q["Properties"]["MessageRetentionPeriod"]) for q in queues.values()) / 86_400

    assert rule["Status"] == "Enabled" and rule["ExpirationInDays"] > longest
    assert rule["NoncurrentVersionExpiration"]["NoncurrentDays"] >= 1
    assert all(r.get("Prefix") in ({"Ref": "ScratchRoot"}, {"Ref": "DeadLetterPrefix"}) for r in rules)


@pytest.mark.parametrize("prefixed", [True, False])
def test_the_sweeper_may_delete_only_items_under_the_session_key_prefix(prefixed: bool) -> None:
    [delete] = [s for s in statements("SweeperRole", HasKeyPrefix=prefixed) if s["Sid"] == "DeleteExpired"]

    if prefixed:
        leading = delete["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
        assert leading == [{"Fn::Sub": "${SessionKeyPrefix}*"}]
    else:
        assert "Condition" not in delete or delete["Condition"] == NO_VALUE


@pytest.mark.parametrize("operator", [True, False])
def test_only_the_cleanup_function_and_the_operator_may_send_to_the_failure_queues(operator: bool) -> None:
    # Redrive cleans what these queues' messages name: a message from anyone else could name a live session.
    policy = resolved(resources("AWS::SQS::QueuePolicy")["FailureQueuesPolicy"])
    queues = [{"Fn::GetAtt": [name, "Arn"]} for name in ("DeadLetterQueue", "OnFailureQueue")]
    role = {"Fn::GetAtt": ["CleanupRole", "Arn"]}
    function = {"Fn::GetAtt": ["CleanupFunction", "Arn"]}
    allow, deny, plain_http = policy["Properties"]["PolicyDocument"]["Statement"]
    assert plain_http["Sid"] == "NoPlainHttp"  # tests/test_template_least_privilege.py

    assert policy["Properties"]["Queues"] == [{"Ref": "DeadLetterQueue"}, {"Ref": "OnFailureQueue"}]
    assert set(resources("AWS::SQS::Queue")) == {
        "DeadLetterQueue",
        "OnFailureQueue",
        "BacklogQueue",
        "BacklogDeadLetterQueue",
    }
    assert (allow["Effect"], allow["Principal"], allow["Action"], allow["Resource"]) == (
        "Allow",
        {"AWS": role},
        "sqs:SendMessage",
        queues,
    )
    assert (deny["Effect"], deny["Principal"], deny["Action"], deny["Resource"]) == (
        "Deny",
        "*",
        "sqs:SendMessage",
        queues,
    )
    allowed = [role, {"Ref": "OperatorRoleArn"}] if operator else role  # the operator: cleanup-worker retag
    assert resolved(deny["Condition"]["ArnNotEqualsIfExists"], HasOperatorRole=operator) == {
        "aws:PrincipalArn": allowed
    }
    assert deny["Condition"]["ArnNotLike"]["aws:SourceArn"][0] == function
    assert set(deny["Condition"]) == {"ArnNotEqualsIfExists", "ArnNotLike"}  # both must differ for the deny


@pytest.mark.parametrize("role", ["CleanupRole", "SweeperRole"])
def test_the_kill_switch_is_read_only_when_one_is_configured(role: str) -> None:
    given = {s["Sid"]: s for s in statements(role, HasKillSwitch=True)}
    created = {s["Sid"]: s for s in statements(role, HasKillSwitch=True, CreateKillSwitchOn=True)}

    assert granted(role, HasKillSwitch=True) - granted(role) == {
        "appconfig:StartConfigurationSession",
        "appconfig:GetLatestConfiguration",
    }
    arn, names = given["ReadKillSwitch"]["Resource"]["Fn::Sub"]
    assert arn.endswith(":application/${App}/environment/${Env}/configuration/${Profile}")
    assert names == {"App": {"Ref": "KillSwitchApplicationId"}, "Env": {"Ref": "KillSwitchEnvironmentId"}} | {
        "Profile": {"Ref": "KillSwitchProfileId"}
    }
    assert created["ReadKillSwitch"]["Resource"]["Fn::Sub"][1] == {
        "App": {"Ref": "KillSwitchApplication"},
        "Env": {"Ref": "KillSwitchEnvironment"},
        "Profile": {"Ref": "KillSwitchProfile"},
    }


def test_the_kill_switch_settings_and_the_extension_layer_are_wired_only_when_given() -> None:
    for function in resources("AWS::Lambda::Function").values():
        properties = function["Properties"]
        variables = properties["Environment"]["Variables"]
        assert resolved(variables["APPCONFIG_PROFILE"], HasKillSwitch=True) == {"Ref": "KillSwitchProfileId"}
        assert resolved(variables["APPCONFIG_PROFILE"]) == NO_VALUE
        layers = properties["Layers"]
        # every function's code (tests/test_template_build.py); SAM names each version of the layer by its hash
        [runtime] = [r for r in resources("AWS::Lambda::LayerVersion") if r.startswith("RuntimeLayer")]
        assert resolved(layers, HasExtensionLayer=True) == [{"Ref": runtime}, {"Ref": "AppConfigExtensionLayerArn"}]
        assert resolved(layers, HasExtensionLayer=False) == [{"Ref": runtime}]


def test_the_reconciler_role_grants_exactly_what_reconcile_calls() -> None:
    files = [
        "worker/reconcile.py",
        "cleanup/operations/reconcile.py",
        "cleanup/operations/leaks.py",
        "cleanup/operations/liveness.py",
    ]
    files += ["cleanup/actions/grant.py", "cleanup/actions/scratch.py", "cleanup/actions/registry.py"]
    # And, from the runtime: the tables' keys (DescribeTable) and the bucket's versioning. Its Query is of the session
    # table (any item under a session's partition key); the registry index's is the stream path's ``prune``: reconcile
    # removes the memberships its Scan found (``remove``).
    calls = aws_calls([ROOT / name for name in files]) | {"describe_table", "get_bucket_versioning"}
    assert calls <= set(IAM_ACTIONS), f"add these calls to IAM_ACTIONS and the policy: {calls - set(IAM_ACTIONS)}"

    needed = {action for call in calls for action in IAM_ACTIONS[call]} | LOGS

    assert granted("ReconcilerPolicy") == needed


def test_the_reconciler_runs_as_the_grants_retiring_principal() -> None:
    # KMS lets only a grant's retiring principal retire it: the cleanup role, which grants name (docs/lambda.md).
    policy = source_template()["Resources"]["ReconcilerPolicy"]

    assert function("worker.reconcile.handler")["Properties"]["Role"] == {"Fn::GetAtt": ["CleanupRole", "Arn"]}
    assert (policy["Condition"], policy["Properties"]["Roles"]) == ("ReconcilerOn", [{"Ref": "CleanupRole"}])


def test_the_reconciler_scans_and_prunes_the_registry_only_when_one_is_configured() -> None:
    by_sid = {s["Sid"]: s for s in statements("ReconcilerPolicy")}
    variables = function("worker.reconcile.handler")["Properties"]["Environment"]["Variables"]

    assert granted("ReconcilerPolicy") - granted("ReconcilerPolicy", HasRegistry=False) == {
        "dynamodb:Scan",
        "dynamodb:BatchWriteItem",
    }
    assert "ScanAndPruneRegistry" not in {s["Sid"] for s in statements("ReconcilerPolicy", HasRegistry=False)}
    assert by_sid["ScanAndPruneRegistry"]["Resource"]["Fn::Sub"].endswith(":table/${RegistryTableName}")
    assert resolved(variables["REGISTRY_TABLE"]) == {"Ref": "RegistryTableName"}
    assert resolved(variables["REGISTRY_TABLE"], HasRegistry=False) == NO_VALUE


def test_the_reconciler_runs_daily_only_when_enabled_on_the_allowed_keys_and_under_the_root() -> None:
    by_sid = {s["Sid"]: s for s in statements("ReconcilerPolicy", ReconcileOtherKeys=False)}
    with_others = {s["Sid"]: s for s in statements("ReconcilerPolicy", ReconcileOtherKeys=True)}
    [rule] = [rule for rule in resources("AWS::Events::Rule").values() if "ReconcilerFunction" in json.dumps(rule)]

    assert parameter("ReconcilerEnabled")["Default"] == "false"
    assert source_template()["Resources"]["ReconcilerFunction"]["Condition"] == "ReconcilerOn"
    assert rule["Properties"]["ScheduleExpression"] == "rate(1 day)"
    assert by_sid["ListAndRetireGrants"]["Resource"] == {"Ref": "KmsKeyArn"}
    assert with_others["ListAndRetireGrants"]["Resource"] == {
        "Fn::Split": [",", {"Fn::Sub": "${KmsKeyArn},${AllowedKmsKeyArns}"}]
    }
    assert by_sid["DeleteUnderScratchRoot"]["Resource"]["Fn::Sub"][0].endswith(":::${Bucket}/${ScratchRoot}*")
    assert by_sid["ListScratchRoot"]["Condition"]["StringLike"] == {"s3:prefix": {"Fn::Sub": "${ScratchRoot}*"}}
    assert by_sid["ReadSessions"]["Resource"]["Fn::Sub"].endswith(":table/${SessionTableName}")
    assert parameter("ReconcileGraceSeconds")["Default"] == Settings().reconcile_grace_seconds
