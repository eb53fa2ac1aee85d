"""The deployment examples (deploy/examples/*/samconfig.toml) deploy with the template as it is: each override names
a parameter and meets its constraints and the template's rules, the functions' environment made from them is a valid
configuration, and the connection-table example's REMOVE records close the right socket, retire the grant and empty
the prefix."""

from __future__ import annotations

import re
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from cleanup.core.pipeline import run_batch
from schemas.outcomes import Status
from schemas.records import read_lambda_event
from schemas.settings import Settings
from tests.stack import SessionStack
from tests.test_template import source_template
from worker.local.gateway import LocalGateway

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "deploy" / "examples").glob("*/samconfig.toml"))
NO_VALUE = object()
PSEUDO = {"AWS::Region": "eu-west-1", "AWS::URLSuffix": "amazonaws.com", "AWS::Partition": "aws"}
PSEUDO |= {"AWS::AccountId": "123456789012", "AWS::StackName": "cleanup"}


def overrides(example: Path) -> dict[str, str]:
    text = tomllib.loads(example.read_text())["default"]["deploy"]["parameters"]["parameter_overrides"]
    return dict(pair.split("=", 1) for pair in text.split())


def parameters(example: Path) -> dict[str, str]:
    values = {name: str(p.get("Default", "")) for name, p in source_template()["Parameters"].items()}
    return values | overrides(example)


class Template:
    """Evaluates the template's intrinsic functions for one set of parameter values."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values, self.template = values, source_template()

    def __call__(self, node: Any) -> Any:  # noqa: C901 - one branch per intrinsic function
        if isinstance(node, list):
            return [value for value in map(self, node) if value is not NO_VALUE]
        if not isinstance(node, dict) or len(node) != 1:
            return {k: self(v) for k, v in node.items()} if isinstance(node, dict) else node
        [(name, arg)] = node.items()
        if name == "Ref":
            return NO_VALUE if arg == "AWS::NoValue" else self.values.get(arg, PSEUDO.get(arg, f"<{arg}>"))
        if name == "Condition":
            return self(self.template["Conditions"][arg])
        if name == "Fn::If":
            return self(arg[1] if self(self.template["Conditions"][arg[0]]) else arg[2])
        if name == "Fn::Equals":
            return str(self(arg[0])) == str(self(arg[1]))
        if name == "Fn::Not":
            return not self(arg[0])
        if name == "Fn::And":
            return all(map(self, arg))
        if name == "Fn::Or":
            return any(map(self, arg))
        if name == "Fn::GetAtt":
            return f"<{'.'.join(arg) if isinstance(arg, list) else arg}>"
        if name == "Fn::Sub":
            text, local = (arg, {}) if isinstance(arg, str) else (arg[0], {k: self(v) for k, v in arg[1].items()})
            return re.sub(r"\$\{([^}]+)\}", lambda m: str(local.get(m[1], self({"Ref": m[1]}))), text)
        return node

    def environment(self, function: str) -> dict[str, str]:
        variables = {
            **self.template["Globals"]["Function"]["Environment"]["Variables"],
            **self.template["Resources"][function]["Properties"]["Environment"]["Variables"],
        }
        resolved = {name: self(value) for name, value in variables.items()}
        return {name: str(value) for name, value in resolved.items() if value is not NO_VALUE}


def test_there_is_an_example_of_each_documented_table_shape() -> None:
    assert [example.parent.name for example in EXAMPLES] == ["connection-table", "session-table"]


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
    evaluate = Template(parameters(example))
    for name, rule in source_template().get("Rules", {}).items():
        if "RuleCondition" not in rule or evaluate(rule["RuleCondition"]):
            assert all(evaluate(a["Assert"]) for a in rule["Assertions"]), name


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.parent.name)
@pytest.mark.parametrize("function", ["CleanupFunction", "DrainFunction", "SweeperFunction", "ReconcilerFunction"])
def test_each_functions_environment_is_a_valid_configuration(example: Path, function: str) -> None:
    environment = Template(parameters(example)).environment(function)

    settings = Settings.model_validate(settings_values(environment))

    expected = overrides(example)
    assert settings.session_sort_key == expected["SessionSortKey"]
    assert settings.attributes.ttl == expected.get("AttrTtl", "ttl")
    assert settings.connection_id_pattern == expected.get("ConnectionIdPattern")


def settings_values(environment: dict[str, str]) -> dict[str, Any]:
    """The environment as the settings read it (ATTR_* into the attribute names)."""
    attributes = {k.removeprefix("ATTR_").lower(): v for k, v in environment.items() if k.startswith("ATTR_")}
    plain = {k.lower(): v for k, v in environment.items() if not k.startswith(("ATTR_", "AWS_"))}
    return {**plain, "attributes": attributes}


def test_the_connection_table_example_cleans_a_connections_session_end_to_end(
    stack: SessionStack, gateway: LocalGateway
) -> None:
    [example] = [path for path in EXAMPLES if path.parent.name == "connection-table"]
    shape = settings_values(Template(parameters(example)).environment("CleanupFunction"))
    ended, live = gateway.connect(), gateway.connect()
    grant = stack.kms.create_grant(
        KeyId=stack.key_arn, GranteePrincipal="arn:aws:iam::123456789012:role/agent", Operations=["Decrypt"]
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
