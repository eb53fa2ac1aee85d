"""Each action kind's machinery exists only where ACTIONS configures it, and each example deploys as it is.

Every example's template, its conditions decided for the example's parameters (``benchmarks.stack``), lints clean
(a reference to a resource the example does not create fails here), creates what its actions need and nothing more,
grants its functions what their code calls for those actions alone, and has a runbook row (docs/operate.md) for each
alarm it creates, naming only outputs it has.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from cfnlint.api import lint_file

from benchmarks.stack import EXAMPLES, NO_VALUE, Stack, overrides
from tests.test_template import IAM_ACTIONS, LOGS, as_list

ROOT = Path(__file__).resolve().parent.parent
OPERATE = (ROOT / "docs" / "operate.md").read_text()
MESSAGES = {"MessageKey", "IntegrityKey", "DeadLetterQueue", "DeadLetterBucket", "BacklogQueue"}
MESSAGES |= {"BacklogDeadLetterQueue", "DrainFunction", "BacklogDrainMapping"}


def example(name: str) -> Path:
    [found] = [path for path in EXAMPLES if path.parent.name == name]
    return found


def code_grants(stack: Stack, function: str = "CleanupFunction") -> set[str]:
    """What ``function``'s code may call in ``stack``: the statements bound to it, or to no function and not kept for
    the mappings (Lambda's own requests)."""
    granted: set[str] = set()
    for name, resource in stack.resources().items():
        if resource["Type"] == "AWS::IAM::Policy":
            documents = [resource["Properties"]]
        elif name == "CleanupRole":
            documents = resource["Properties"]["Policies"]
        else:
            continue
        for document in documents:
            for statement in stack(document["PolicyDocument"]["Statement"]):
                condition = statement.get("Condition", {})
                if condition.get("Null") == {"lambda:SourceFunctionArn": "true"}:
                    continue
                bound = as_list(condition.get("ArnLike", {}).get("lambda:SourceFunctionArn", []))
                if not bound or f"<{function}.Arn>" in bound:
                    granted |= set(as_list(statement["Action"]))
    return granted


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.parent.name)
def test_each_example_lints_clean_as_it_deploys(path: Path, tmp_path: Path) -> None:
    concrete = tmp_path / "template.json"
    concrete.write_text(json.dumps(Stack.of(path).concrete()))

    assert [str(match) for match in lint_file(concrete)] == []


def test_a_socket_only_stack_creates_no_key_bucket_dead_letter_queue_backlog_or_drain() -> None:
    stack = Stack.of(example("socket-only"))
    kinds = {resource["Type"] for resource in stack.resources().values()}

    assert overrides(example("socket-only"))["Actions"] == "connection"
    assert not {"AWS::KMS::Key", "AWS::S3::Bucket", "AWS::S3::BucketPolicy"} & kinds
    assert not MESSAGES & set(stack.resources())
    assert list(stack.of_type("AWS::SQS::Queue")) == ["OnFailureQueue"]  # the mapping's, for redrive
    # The stream check watches the mapping's stream whatever the sessions hold (a socket's records age out too).
    assert list(stack.of_type("AWS::Serverless::Function")) == ["CleanupFunction", "StreamCheckFunction"]
    assert "KmsKeyArn" not in overrides(example("socket-only"))
    assert stack(stack.template["Resources"]["OnFailureQueue"]["Properties"])["SqsManagedSseEnabled"] is True


def test_a_socket_only_stacks_function_may_call_what_closing_a_socket_calls_and_nothing_else() -> None:
    stack = Stack.of(example("socket-only"))
    environment = stack.environment("CleanupFunction")

    needed = IAM_ACTIONS["batch_get_item"] | IAM_ACTIONS["delete_connection"] | LOGS
    assert code_grants(stack) == needed
    assert not {"SCRATCH_BUCKET", "KMS_KEY_ID", "DEAD_LETTER_QUEUE_URL", "BACKLOG_QUEUE_URL"} & set(environment)
    assert environment["WS_CALLBACK_URL"].startswith("https://abcdef1234.execute-api.eu-west-1.")


@pytest.mark.parametrize(
    ("actions", "present", "absent"),
    [
        ("connection", {"execute-api:ManageConnections"}, {"kms:RetireGrant", "s3:DeleteObject", "sqs:SendMessage"}),
        ("grant", {"kms:RetireGrant", "kms:ListGrants", "sqs:SendMessage"}, {"execute-api:ManageConnections"}),
        ("scratch", {"s3:DeleteObject", "s3:ListBucketVersions"}, {"kms:RetireGrant", "kms:ListGrants"}),
        ("http-close", set(), {"execute-api:ManageConnections", "kms:RetireGrant", "sqs:SendMessage"}),
        ("connection,rooms", {"execute-api:ManageConnections", "sqs:SendMessage"}, {"kms:RetireGrant"}),
    ],
)
def test_each_actions_permissions_only_with_that_action(actions: str, present: set[str], absent: set[str]) -> None:
    values = {"Actions": actions, "WebSocketApiId": "abcdef1234", "SessionTableName": "sessions"}
    values["SessionTableStreamArn"] = "arn:aws:dynamodb:eu-west-1:123456789012:table/sessions/stream/1"
    values["KmsKeyArn"] = "arn:aws:kms:eu-west-1:123456789012:key/1"
    granted = code_grants(Stack(values))

    assert present <= granted and not absent & granted


@pytest.mark.parametrize(
    ("actions", "kinds"),
    [
        ("connection,grant,scratch,registry", {"ConnectionOn", "GrantOn", "ScratchOn", "RegistryOn", "MessagesOn"}),
        ("connection", {"ConnectionOn", "OnlySockets"}),
        ("http-close", {"OnlySockets"}),
        ("http-close,connection", {"ConnectionOn", "OnlySockets"}),
        ("connectionx", {"MessagesOn"}),  # an installed kind whose name begins with another's
        ("my-grant,scratch", {"ScratchOn", "MessagesOn"}),
        ("grant", {"GrantOn", "MessagesOn"}),
    ],
)
def test_the_conditions_read_each_name_in_actions_whole(actions: str, kinds: set[str]) -> None:
    stack = Stack({"Actions": actions})
    names = ("ConnectionOn", "GrantOn", "ScratchOn", "RegistryOn", "OnlySockets", "MessagesOn")

    assert {name for name in names if stack.condition(name)} == kinds


def test_the_key_is_asked_for_only_with_the_grant_action() -> None:
    key = Stack({}).template["Parameters"]["KmsKeyArn"]

    assert key["Default"] == "" and re.fullmatch(key["AllowedPattern"], "")
    for path in EXAMPLES:
        grants = Stack.of(path).condition("GrantOn")
        assert ("KmsKeyArn" in overrides(path)) is grants, path.parent.name


def alarm_rows() -> dict[str, str]:
    """Each alarm of the runbook's table (docs/operate.md, "Alarms") and its row."""
    section = OPERATE[OPERATE.index("## Alarms") : OPERATE.index("## Stream retention")]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            rows |= dict.fromkeys(re.findall(r"`(\w+Alarm)`", first), line)
    return rows


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.parent.name)
def test_every_alarm_of_each_example_notifies_its_topic_and_its_runbook_row_works(path: Path) -> None:
    stack = Stack.of(path)
    outputs = set(stack.outputs())
    topic = overrides(path)["AlarmTopicArn"]

    for name, alarm in stack.of_type("AWS::CloudWatch::Alarm").items():
        assert stack(alarm["Properties"]["AlarmActions"]) == [topic], name
        row = alarm_rows()[name]
        for output in set(re.findall(r"<([A-Z]\w+)>", row)):  # an output to fill in: <OnFailureQueueUrl>
            assert output in outputs, f"{name}'s runbook row names {output}, which {path.parent.name} lacks"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.parent.name)
def test_the_operator_may_read_each_examples_dead_letters(path: Path) -> None:
    # Reading a dead letter needs the stack's key: the example names the operators' role, and the key lets it.
    stack = Stack.of(path)
    operator = overrides(path)["OperatorRoleArn"]
    keys = stack.of_type("AWS::KMS::Key")
    if "MessageKey" not in keys:
        assert "DeadLetterQueue" not in stack.resources()  # no dead letter to read: the on-failure queue is SQS's own
        return
    statements: list[dict[str, Any]] = stack(keys["MessageKey"]["Properties"]["KeyPolicy"]["Statement"])

    assert {"AWS": operator} in [statement["Principal"] for statement in statements]
    assert NO_VALUE not in statements
