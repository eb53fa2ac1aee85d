"""The deployment examples (deploy/examples/*/samconfig.toml) deploy with the template as it is: each override names
a parameter and meets its constraints and the template's rules, the functions' environment made from them is a valid
configuration, and the connection-table example's REMOVE records close the right socket, retire the grant and empty
the prefix."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.stack import EXAMPLES, Stack, overrides, source_template
from cleanup.queues.reporting import run_batch
from schemas.outcomes import Status
from schemas.records import read_lambda_event
from schemas.settings import Settings
from tests.stack import SessionStack, client
from worker.local.gateway import LocalGateway


def parameters(example: Path) -> dict[str, str]:
    return Stack.of(example).values


def test_there_is_an_example_of_each_documented_table_shape() -> None:
    assert [example.parent.name for example in EXAMPLES] == ["connection-table", "session-table", "socket-only"]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.parent.name)
def test_every_override_names_a_parameter_and_meets_its_constraints(example: Path) -> None:
    declared = source_template()["Parameters"]
    for name, value in overrides(example).items():
        assert name in declared, f"{example}: no parameter {name}"
        spec = declared[name]
        if "AllowedValues" in spec:
            assert value in [str(v) for v in spec["AllowedValues"]], (name, value)
        if "AllowedPattern" in spec:
            assert re.fullmatch(spec["AllowedPattern"], value), (name, value)
        if "MinValue" in spec:
            assert float(value) >= float(spec["MinValue"]), (name, value)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.parent.name)
def test_the_templates_rules_hold_for_each_example(example: Path) -> None:
    evaluate = Stack.of(example)
    for name, rule in source_template().get("Rules", {}).items():
        if "RuleCondition" not in rule or evaluate(rule["RuleCondition"]):
            assert all(evaluate(a["Assert"]) for a in rule["Assertions"]), name


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.parent.name)
def test_each_functions_environment_is_a_valid_configuration(example: Path) -> None:
    stack = Stack.of(example)
    functions = list(stack.of_type("AWS::Serverless::Function"))
    assert "CleanupFunction" in functions
    for function in functions:
        settings = Settings.model_validate(settings_values(stack.environment(function)))

        expected = overrides(example)
        assert settings.session_sort_key == expected["SessionSortKey"], function
        assert settings.attributes.ttl == expected.get("AttrTtl", "ttl"), function
        assert settings.connection_id_pattern == expected.get("ConnectionIdPattern"), function


def settings_values(environment: dict[str, str]) -> dict[str, Any]:
    """The environment as the settings read it (ATTR_* into the attribute names)."""
    attributes = {k.removeprefix("ATTR_").lower(): v for k, v in environment.items() if k.startswith("ATTR_")}
    plain = {k.lower(): v for k, v in environment.items() if not k.startswith(("ATTR_", "AWS_"))}
    return {**plain, "attributes": attributes}


def test_the_connection_table_example_cleans_a_connections_session_end_to_end(
    stack: SessionStack, gateway: LocalGateway
) -> None:
    [example] = [path for path in EXAMPLES if path.parent.name == "connection-table"]
    shape = settings_values(Stack.of(example).environment("CleanupFunction"))
    ended, live = gateway.connect(), gateway.connect()
    worker = str(client("sts").get_caller_identity()["Arn"]).replace(":sts::", ":iam::")
    grant = stack.kms.create_grant(  # unnamed, as the application makes it, for the worker to retire
        KeyId=stack.key_arn,
        GranteePrincipal="arn:aws:iam::123456789012:role/agent",
        Operations=["Decrypt"],
        RetiringPrincipal=worker,
    )["GrantId"]
    expires = int(time.time()) + 3600
    for n in range(3):
        stack.s3.put_object(Bucket=stack.bucket, Key=f"sessions/t1/{ended.connection_id}/part-{n}", Body=b"x")
    ended_key = f"conn#{ended.connection_id}"
    stack.put_item(
        {
            "pk": ended_key,
            "sk": "metadata",
            "expires_at": expires,
            "grantId": grant,
            "tenantId": "t1",
            "scratchPrefix": f"sessions/t1/{ended.connection_id}/",
        }
    )
    stack.put_item({"pk": ended_key, "sk": "subscription#room-1", "expires_at": expires})
    stack.put_item({"pk": f"conn#{live.connection_id}", "sk": "subscription#room-1", "expires_at": expires})
    for sort_key in ("metadata", "subscription#room-1"):
        stack.ddb.delete_item(TableName=stack.table, Key={"pk": {"S": ended_key}, "sk": {"S": sort_key}})
    stack.ddb.delete_item(
        TableName=stack.table, Key={"pk": {"S": f"conn#{live.connection_id}"}, "sk": {"S": "subscription#room-1"}}
    )
    shape_names = ("session_key_prefix", "session_sort_key", "connection_id_pattern", "scratch_root")
    shape_names += ("scratch_tenant_scoped", "session_binding", "attributes")
    shaped = {name: value for name, value in shape.items() if name in shape_names}
    runtime = stack.runtime(**shaped, cleanup_mode="enforce", ws_callback_url=gateway.callback_url)

    outcomes = [o for o in run_batch(read_lambda_event(stack.lambda_event()), runtime) if o.event_name == "REMOVE"]

    assert [o.status for o in outcomes] == [Status.CLEANED, Status.SKIPPED, Status.SKIPPED]
    assert ended.wait_closed(5.0) and gateway.is_open(live.connection_id)
    assert grant not in stack.grant_ids()
    assert stack.objects(f"sessions/t1/{ended.connection_id}/") == []
