"""The template's part of the operator's commands and of the integrity key's rotation: the operator's policy, the keys
a rotation replaced (verification only), and an alarm for any kill switch mode other than the deployment's."""

from __future__ import annotations

from typing import Any

import pytest

from tests.test_template import parameter, resolved, source_template, statements, transformed
from tests.test_template_integrity import KEY, by_sid

PREVIOUS = {"Fn::Split": [",", {"Fn::Sub": ["${Key},${IntegrityPreviousKeyArns}", {"Key": KEY}]}]}


def operator_policy(**conditions: bool) -> dict[str, dict[str, Any]]:
    policy = transformed()["Resources"]["OperatorPolicy"]
    assert policy["Type"] == "AWS::IAM::ManagedPolicy" and policy["Condition"] == "HasOperatorRole"
    document = resolved(policy["Properties"]["PolicyDocument"], **conditions)
    return {statement["Sid"]: statement for statement in document["Statement"]}


def test_the_operator_may_take_the_functions_settings_and_tag_only_with_the_current_key() -> None:
    found = operator_policy(HasPreviousIntegrityKeys=True)

    assert found["TakeFunctionSettings"]["Action"] == "lambda:GetFunctionConfiguration"
    assert found["TakeFunctionSettings"]["Resource"] == [
        {"Fn::GetAtt": ["CleanupFunction", "Arn"]},
        {"Fn::GetAtt": ["DrainFunction", "Arn"]},
    ]
    assert resolved(found["RetagMessages"]["Resource"]) == resolved(KEY)  # never with a previous key
    assert found["VerifyMessages"]["Resource"] == resolved(PREVIOUS)
    assert {"sqs:SendMessage", "sqs:DeleteMessage"} <= set(found["RedriveAndRetagQueues"]["Action"])
    assert transformed()["Outputs"]["OperatorPolicyArn"]["Value"] == {"Ref": "OperatorPolicy"}


@pytest.mark.parametrize("previous", [True, False])
def test_the_drain_verifies_with_the_keys_a_rotation_replaced_and_tags_with_none_of_them(previous: bool) -> None:
    verifying = {s["Sid"]: s for s in statements("DrainPolicy", HasPreviousIntegrityKeys=previous)}
    tagging = {s["Sid"]: s for s in statements("CleanSessionsPolicy", HasPreviousIntegrityKeys=previous)}

    expected = PREVIOUS if previous else KEY
    assert verifying["VerifyOwnMessages"]["Resource"] == resolved(expected)
    assert (
        resolved(tagging["TagOwnMessages"]["Resource"])
        == resolved(KEY)
        == by_sid("CleanSessionsPolicy")["TagOwnMessages"]["Resource"]
    )
    assert parameter("IntegrityPreviousKeyArns")["Default"] == ""


@pytest.mark.parametrize("enforcing", [True, False])
def test_the_paused_alarm_fires_for_a_dry_run_set_on_the_switch_when_the_deployment_enforces(enforcing: bool) -> None:
    alarm = resolved(transformed()["Resources"]["KillSwitchPausedAlarm"]["Properties"], Enforcing=enforcing)
    modes = [
        dimension["Value"]
        for metric in alarm["Metrics"]
        if "MetricStat" in metric and metric["MetricStat"]["Metric"]["MetricName"] == "ModeChanges"
        for dimension in metric["MetricStat"]["Metric"]["Dimensions"]
        if dimension["Name"] == "Mode"
    ]
    [total] = [metric for metric in alarm["Metrics"] if metric["Id"] == "total"]

    assert modes == (["paused", "dry-run"] if enforcing else ["paused"])
    assert ("FILL(dry, 0)" in total["Expression"]) is enforcing
    assert source_template()["Conditions"]["Enforcing"] == {"Fn::Equals": [{"Ref": "CleanupMode"}, "enforce"]}
