"""deploy/template.yaml around the message path: the layer that runs as the grants' retiring principal is AWS's own,
no queue takes another's dead letters, nothing travels in plain HTTP, dead letters live in a bucket of their own under
a key of the stack's, and each function of the retiring principal's role is allowed only its own calls."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.test_template import parameter, resources

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
    for policy in resources("AWS::SQS::QueuePolicy").values():
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
