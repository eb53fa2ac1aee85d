"""The template's part of message integrity: an HMAC key (or an existing one), its setting on every function that
writes or reads the worker's own messages, and its use split between the writers and the readers."""

from __future__ import annotations

from typing import Any

from tests.test_template import function, parameter, resolved, statements, transformed

KEY = {"Fn::If": ["CreateIntegrityKey", {"Fn::GetAtt": ["IntegrityKey", "Arn"]}, {"Ref": "IntegrityKeyArn"}]}
MESSAGE_FUNCTIONS = ("worker.lambda_handler.handler", "worker.backlog.handler")


def by_sid(policy: str) -> dict[str, dict[str, Any]]:
    return {statement["Sid"]: statement for statement in statements(policy)}


def bound_to(statement: dict[str, Any]) -> list[Any]:
    arns = statement["Condition"]["ArnLike"]["lambda:SourceFunctionArn"]
    return arns if isinstance(arns, list) else [arns]


def test_the_stack_makes_an_hmac_key_unless_one_is_given() -> None:
    key = transformed()["Resources"]["IntegrityKey"]
    assert key["Condition"] == "CreateIntegrityKey"
    assert (key["Properties"]["KeySpec"], key["Properties"]["KeyUsage"]) == ("HMAC_256", "GENERATE_VERIFY_MAC")
    assert transformed()["Conditions"]["CreateIntegrityKey"] == {
        "Fn::And": [{"Condition": "MessagesOn"}, {"Fn::Equals": [{"Ref": "IntegrityKeyArn"}, ""]}]
    }
    assert parameter("IntegrityKeyArn")["Default"] == ""


def test_every_function_that_writes_or_reads_messages_has_the_key() -> None:
    for handler in MESSAGE_FUNCTIONS:
        assert resolved(function(handler)["Properties"]["Environment"]["Variables"]["INTEGRITY_KEY_ID"]) == KEY


def test_tagging_and_verifying_are_each_one_action_on_that_key_alone_for_the_functions_that_do_it() -> None:
    tagging, verifying = by_sid("CleanSessionsPolicy")["TagOwnMessages"], by_sid("DrainPolicy")

    assert tagging["Action"] == "kms:GenerateMac"
    assert verifying["VerifyOwnMessages"]["Action"] == "kms:VerifyMac"
    for statement in (tagging, verifying["VerifyOwnMessages"]):
        assert resolved(statement["Resource"]) == resolved(KEY)
        assert statement["Condition"]["StringEquals"] == {"kms:MacAlgorithm": "HMAC_SHA_256"}
    writers = [{"Fn::GetAtt": ["CleanupFunction", "Arn"]}, {"Fn::GetAtt": ["DrainFunction", "Arn"]}]
    assert bound_to(tagging) == writers
    assert bound_to(verifying["VerifyOwnMessages"]) == [{"Fn::GetAtt": ["DrainFunction", "Arn"]}]
    moving = verifying["MoveRefusedBacklogMessages"]
    assert moving["Resource"] == {"Fn::GetAtt": ["BacklogDeadLetterQueue", "Arn"]}
    assert bound_to(moving) == [{"Fn::GetAtt": ["DrainFunction", "Arn"]}]
