"""deploy/template.yaml around the message path: the layer that runs as the grants' retiring principal is AWS's own,
no queue takes another's dead letters, nothing travels in plain HTTP, dead letters live in a bucket of their own under
a key of the stack's, and each function of the retiring principal's role is allowed only its own calls."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.test_template import (
    as_list,
    attached,
    for_mappings,
    function,
    granted_to_code,
    parameter,
    resolved,
    resources,
    source_functions,
    source_template,
    statements,
)

# AWS's AppConfig extension layers, as AWS AppConfig's user guide lists them ("Available versions of the AWS
# AppConfig Agent Lambda extension"): the account differs by Region.
APPCONFIG_LAYERS = [
    "arn:aws:lambda:us-east-1:027255383542:layer:AWS-AppConfig-Extension-Arm64:61",
    "arn:aws:lambda:eu-west-1:434848589818:layer:AWS-AppConfig-Extension-Arm64:243",
    "arn:aws:lambda:eu-west-1:434848589818:layer:AWS-AppConfig-Extension:305",
    "arn:aws:lambda:ap-southeast-2:080788657173:layer:AWS-AppConfig-Extension-Arm64:49",
    "arn:aws-cn:lambda:cn-north-1:615057806174:layer:AWS-AppConfig-Extension:76",
    "arn:aws-us-gov:lambda:us-gov-west-1:946746059096:layer:AWS-AppConfig-Extension:54",
    "",
]
NOT_APPCONFIG_LAYERS = [
    "arn:aws:lambda:eu-west-1:123456789012:layer:AWS-AppConfig-Extension-Arm64:63",  # someone else's account
    "arn:aws:lambda:us-east-1:434848589818:layer:AWS-AppConfig-Extension-Arm64:63",  # another Region's account
    "arn:aws:lambda:eu-west-1:434848589818:layer:my-extension:1",
    "arn:aws:lambda:eu-west-1:434848589818:layer:AWS-AppConfig-Extension-Arm64",  # no version
    "arn:aws:lambda:eu-west-1:434848589818:layer:AWS-AppConfig-Extension-Arm64:1,arn:aws:lambda:x",
]


@pytest.mark.parametrize("arn", APPCONFIG_LAYERS)
def test_the_extension_layer_may_be_one_of_awss_appconfig_layers_or_none(arn: str) -> None:
    assert re.fullmatch(parameter("AppConfigExtensionLayerArn")["AllowedPattern"], arn)


@pytest.mark.parametrize("arn", NOT_APPCONFIG_LAYERS)
def test_no_other_layer_runs_as_the_grants_retiring_principal(arn: str) -> None:
    assert not re.fullmatch(parameter("AppConfigExtensionLayerArn").get("AllowedPattern", ".*"), arn)


def arn(name: str) -> dict[str, Any]:
    return {"Fn::GetAtt": [name, "Arn"]}


def backlog_arn() -> Any:
    """The backlog queue's ARN, as the template spells it where its own attribute would make a cycle."""
    return resources("AWS::SQS::Queue")["BacklogDeadLetterQueue"]["Properties"]["RedriveAllowPolicy"][
        "sourceQueueArns"
    ][0]


@pytest.mark.parametrize("queue", ["DeadLetterQueue", "OnFailureQueue", "BacklogQueue"])
def test_no_queue_may_name_these_queues_as_its_dead_letter_queue(queue: str) -> None:
    # A queue naming one of them as its dead-letter target would put messages there that no queue policy vets.
    properties = resources("AWS::SQS::Queue")[queue]["Properties"]

    assert properties["RedriveAllowPolicy"] == {"redrivePermission": "denyAll"}


def test_only_the_backlog_may_move_its_failing_messages_to_the_backlogs_dead_letter_queue() -> None:
    queues = resources("AWS::SQS::Queue")
    allow = queues["BacklogDeadLetterQueue"]["Properties"]["RedriveAllowPolicy"]
    name = queues["BacklogQueue"]["Properties"]["QueueName"]

    assert allow["redrivePermission"] == "byQueue"
    assert allow["sourceQueueArns"] == [
        {"Fn::Sub": "arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:" + name["Fn::Sub"]}
    ]
    assert queues["BacklogQueue"]["Properties"]["RedrivePolicy"]["deadLetterTargetArn"] == arn("BacklogDeadLetterQueue")


def refuses_plain_http(statement: dict[str, Any], service: str) -> bool:
    return (
        statement["Effect"] == "Deny"
        and statement["Principal"] == "*"
        and statement["Action"] == f"{service}:*"
        and statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    )


def test_every_queue_refuses_requests_in_plain_http() -> None:
    refused = []
    for policy in map(resolved, resources("AWS::SQS::QueuePolicy").values()):
        document = policy["Properties"]["PolicyDocument"]
        [deny] = [s for s in document["Statement"] if refuses_plain_http(s, "sqs")]
        assert deny["Resource"] == [arn(ref["Ref"]) for ref in policy["Properties"]["Queues"]]
        refused += [ref["Ref"] for ref in policy["Properties"]["Queues"]]

    assert sorted(refused) == sorted(resources("AWS::SQS::Queue"))


def test_every_bucket_the_stack_creates_refuses_requests_in_plain_http() -> None:
    policies = resources("AWS::S3::BucketPolicy").values()
    by_bucket = {p["Properties"]["Bucket"]["Ref"]: p for p in policies}

    assert set(by_bucket) == set(resources("AWS::S3::Bucket"))
    for bucket, policy in by_bucket.items():
        [deny] = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if refuses_plain_http(s, "s3")]
        assert deny["Resource"] == [arn(bucket), {"Fn::Sub": "${" + bucket + ".Arn}/*"}]
        assert policy.get("Condition") == resources("AWS::S3::Bucket")[bucket].get("Condition")


def dead_letter_bucket() -> dict[str, Any]:
    bucket: dict[str, Any] = resources("AWS::S3::Bucket")["DeadLetterBucket"]
    return bucket


STORED_BUCKET = {"Fn::If": ["CreateDeadLetterBucket", {"Ref": "DeadLetterBucket"}, {"Ref": "DeadLetterBucketName"}]}


def test_the_stack_keeps_dead_letters_in_a_versioned_bucket_of_their_own_unless_one_is_named() -> None:
    bucket = dead_letter_bucket()
    properties = bucket["Properties"]
    [encryption] = properties["BucketEncryption"]["ServerSideEncryptionConfiguration"]

    assert bucket["Condition"] == "CreateDeadLetterBucket"
    assert source_template()["Conditions"]["CreateDeadLetterBucket"] == {
        "Fn::And": [{"Condition": "MessagesOn"}, {"Fn::Equals": [{"Ref": "DeadLetterBucketName"}, ""]}]
    }
    assert properties["VersioningConfiguration"] == {"Status": "Enabled"}
    assert encryption["ServerSideEncryptionByDefault"] == {
        "SSEAlgorithm": "aws:kms",
        "KMSMasterKeyID": arn("MessageKey"),
    }
    assert encryption["BucketKeyEnabled"] is True
    assert all(properties["PublicAccessBlockConfiguration"].values())
    for handler in ("worker.lambda_handler.handler", "worker.backlog.handler"):
        variables = function(handler)["Properties"]["Environment"]["Variables"]
        assert resolved(variables["DEAD_LETTER_BUCKET"]) == STORED_BUCKET


def test_dead_letters_in_their_own_bucket_expire_only_after_every_message_that_can_name_them() -> None:
    rules = dead_letter_bucket()["Properties"]["LifecycleConfiguration"]["Rules"]
    longest = max(int(q["Properties"]["MessageRetentionPeriod"]) for q in resources("AWS::SQS::Queue").values())
    [expire] = [r for r in rules if "ExpirationInDays" in r]

    assert expire["Prefix"] == {"Ref": "DeadLetterPrefix"} and expire["ExpirationInDays"] > longest / 86_400
    assert any(r.get("ExpiredObjectDeleteMarker") is True for r in rules)


@pytest.mark.parametrize("operator", [True, False])
def test_only_the_cleanup_role_and_the_operator_role_may_put_get_or_delete_dead_letters(operator: bool) -> None:
    [policy] = [
        p
        for p in resources("AWS::S3::BucketPolicy").values()
        if p["Properties"]["Bucket"] == {"Ref": "DeadLetterBucket"}
    ]
    [deny] = [
        s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Sid"] == "OnlyTheWorkerAndTheOperator"
    ]
    allowed = [arn("CleanupRole"), {"Ref": "OperatorRoleArn"}] if operator else [arn("CleanupRole")]

    assert (deny["Effect"], deny["Principal"]) == ("Deny", "*")
    assert set(deny["Action"]) == {
        "s3:PutObject",
        "s3:GetObject",
        "s3:GetObjectVersion",
        "s3:DeleteObject",
        "s3:DeleteObjectVersion",
    }
    assert deny["Resource"] == {"Fn::Sub": "${DeadLetterBucket.Arn}/${DeadLetterPrefix}*"}
    assert resolved(deny["Condition"], HasOperatorRole=operator) == {"ArnNotEquals": {"aws:PrincipalArn": allowed}}
    assert re.fullmatch(parameter("OperatorRoleArn")["AllowedPattern"], "arn:aws:iam::123456789012:role/ops/redrive")


def test_the_queues_and_the_dead_letter_bucket_are_encrypted_with_the_stacks_own_key() -> None:
    for name, queue in resources("AWS::SQS::Queue").items():
        assert resolved(queue["Properties"])["KmsMasterKeyId"] == {"Ref": "MessageKey"}, name
        assert "SqsManagedSseEnabled" not in resolved(queue["Properties"]), name
    # Without the messages' machinery (a socket alone), the on-failure queue, which holds only sequence ranges, has
    # SQS's own encryption: no key of the stack's is made for it.
    on_failure = resolved(resources("AWS::SQS::Queue")["OnFailureQueue"]["Properties"], MessagesOn=False)
    assert "KmsMasterKeyId" not in on_failure and on_failure["SqsManagedSseEnabled"] is True
    assert resources("AWS::KMS::Key")["MessageKey"]["Properties"]["EnableKeyRotation"] is True


@pytest.mark.parametrize("operator", [True, False])
def test_only_the_cleanup_role_and_the_operator_role_may_use_the_key_and_only_through_sqs_and_s3(
    operator: bool,
) -> None:
    policy = resources("AWS::KMS::Key")["MessageKey"]["Properties"]["KeyPolicy"]
    statements = resolved(policy["Statement"], HasOperatorRole=operator)
    using = [s for s in statements if {"kms:Decrypt", "kms:GenerateDataKey"} & set(as_list(s["Action"]))]
    through = [{"Fn::Sub": f"{service}.${{AWS::Region}}.amazonaws.com"} for service in ("sqs", "s3")]

    assert [s["Principal"] for s in using] == [
        {"AWS": a} for a in ([arn("CleanupRole")] + ([{"Ref": "OperatorRoleArn"}] if operator else []))
    ]
    for statement in using:
        assert set(as_list(statement["Action"])) == {"kms:Decrypt", "kms:GenerateDataKey"}
        assert statement["Condition"] == {"StringEquals": {"kms:ViaService": through}}
    # The account administers the key (its policy can be changed through IAM) but uses it only through those roles.
    for statement in statements:
        assert (
            not any(
                a in ("kms:*", "kms:Decrypt", "kms:Encrypt", "kms:CreateGrant") for a in as_list(statement["Action"])
            )
            or statement in using
        )


RETIRING = {"CleanupFunction", "DrainFunction", "ReconcilerFunction"}
SHARED = {"Logs", "ReadKillSwitch"}  # every function of the role: its log group, and the kill switch's extension


def test_the_functions_that_retire_grants_run_as_the_one_role_grants_name() -> None:
    roles = {name: f["Properties"]["Role"] for name, f in source_template()["Resources"].items() if name in RETIRING}

    assert roles == dict.fromkeys(RETIRING, arn("CleanupRole"))
    assert source_template()["Outputs"]["CleanupRoleArn"]["Value"] == arn("CleanupRole")


@pytest.mark.parametrize("kinesis", [False, True], ids=["dynamodb-stream", "kinesis-stream"])
def test_every_statement_of_the_role_is_bound_to_the_functions_that_call_it(kinesis: bool) -> None:
    for statement in attached("CleanupRole", KinesisSource=kinesis, HasRegistry=True, HasKillSwitch=True):
        functions = source_functions(statement)
        if functions is None:
            assert for_mappings(statement) or statement["Sid"] in SHARED, statement
        else:
            assert functions and {f["Fn::GetAtt"][0] for f in functions} <= RETIRING, statement
            assert functions == [arn(f["Fn::GetAtt"][0]) for f in functions]


def test_lambda_alone_reads_the_stream_receives_from_the_backlog_and_reports_failed_batches() -> None:
    # Requests from a function's code carry lambda:SourceFunctionArn; Lambda's own for a mapping do not.
    mapping = {s["Sid"]: s for s in attached("CleanupRole") if for_mappings(s)}

    assert set(mapping) == {"ReadStream", "ListStreams", "OnFailureDestination", "DrainBacklog"}
    assert mapping["OnFailureDestination"]["Resource"] == arn("OnFailureQueue")
    assert mapping["DrainBacklog"]["Resource"] == arn("BacklogQueue")


DRAIN_ONLY = {
    "sqs:ReceiveMessage",
    "sqs:DeleteMessage",
    "sqs:ChangeMessageVisibility",
    "s3:GetObject",
    "s3:GetObjectVersion",
}
RECONCILE_ONLY = {"kms:ListGrants", "dynamodb:Scan"}


def test_the_stream_function_can_neither_drain_nor_read_dead_letters_nor_list_grants_nor_scan() -> None:
    # Without SessionBinding: with it, the stream function reads a grant's name (ListGrants by grant id) before it
    # retires it, and nothing else of the reconciler's.
    stream = granted_to_code("CleanupFunction", HasRegistry=True, HasKillSwitch=True, BindingOn=False)
    bound = granted_to_code("CleanupFunction", HasRegistry=True, HasKillSwitch=True, BindingOn=True)
    assert bound - stream == {"kms:ListGrants"}
    stored = [s for s in attached("CleanupRole") if "${DeadLetterPrefix}" in json.dumps(s["Resource"])]
    by_stream = {
        a for s in stored if arn("CleanupFunction") in (source_functions(s) or []) for a in as_list(s["Action"])
    }

    assert stream & (DRAIN_ONLY | RECONCILE_ONLY) == set()
    assert by_stream == {"s3:PutObject"}  # it stores a record too large for a message, and nothing more


def test_the_drain_reads_a_stored_record_by_version_and_may_list_where_it_is() -> None:
    # Without s3:ListBucket, S3 answers a read of a missing object with 403, not 404: a duplicate message, whose record
    # an earlier one already cleaned and deleted, would never be recognised as done.
    statements = {s["Sid"]: s for s in attached("CleanupRole")}
    reads, lists = statements["DrainStoredRecords"], statements["ListStoredRecords"]

    assert {"s3:GetObject", "s3:GetObjectVersion", "s3:DeleteObjectVersion"} <= set(reads["Action"])
    assert reads["Resource"]["Fn::Sub"] == [
        "arn:${AWS::Partition}:s3:::${Bucket}/${DeadLetterPrefix}*",
        {"Bucket": STORED_BUCKET},
    ]
    assert (lists["Action"], lists["Resource"]["Fn::Sub"]) == (
        "s3:ListBucket",
        ["arn:${AWS::Partition}:s3:::${Bucket}", {"Bucket": STORED_BUCKET}],
    )
    for statement in (reads, lists):
        assert source_functions(statement) == [arn("DrainFunction")]


LAMBDA_PAGE = (Path(__file__).resolve().parent.parent / "docs" / "lambda.md").read_text()
POLICIES = (
    "CleanupRole",
    "CleanSessionsPolicy",
    "StreamPolicy",
    "DrainPolicy",
    "ReconcilerPolicy",
    "SweeperRole",
    "StreamCheckRole",
    "CanaryRole",
)
FOR = {"CleanupFunction": "stream", "DrainFunction": "drain", "ReconcilerFunction": "reconciler"}


def template_rows() -> set[tuple[str, str, str, frozenset[str]]]:
    """(policy, Sid, for whom, actions) of every statement, whichever branch of a condition includes it."""
    rows = set()
    for policy in POLICIES:
        for kinesis in (True, False):
            for s in statements(
                policy, KinesisSource=kinesis, HasRegistry=True, HasKillSwitch=True, AskVersioning=True
            ):
                functions = source_functions(s)
                who = (
                    "mapping"
                    if for_mappings(s)
                    else "all"
                    if functions is None
                    else ", ".join(FOR[f["Fn::GetAtt"][0]] for f in functions)
                )
                rows.add((policy, s["Sid"], who, frozenset(as_list(s["Action"]))))
    return rows


def documented_rows() -> set[tuple[str, str, str, frozenset[str]]]:
    table = LAMBDA_PAGE.split("<!-- permissions:start -->")[1].split("<!-- permissions:end -->")[0]
    rows = set()
    for line in table.strip().splitlines()[2:]:
        policy, sid, who, actions, _ = (cell.strip() for cell in line.strip("|").split("|"))
        rows.add((policy.strip("`"), sid.strip("`"), who, frozenset(a.strip(" `") for a in actions.split(","))))
    return rows


def test_the_documented_permissions_table_is_the_template_statement_by_statement() -> None:
    assert documented_rows() == template_rows()
