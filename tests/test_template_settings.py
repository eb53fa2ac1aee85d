"""Every setting a deployment may need is a template parameter, and the settings that shape a session reach every
function that reads records or items. Derived from the settings model and the SAM-transformed template."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.settings import NOT_DEPLOYED, SESSION_SHAPE, AttributeNames, Settings
from tests.test_template import resources, source_template

FUNCTIONS = ("CleanupFunction", "DrainFunction", "SweeperFunction", "ReconcilerFunction")


def variables() -> list[str]:
    """Every environment variable the settings model reads."""
    names = []
    for name, field in Settings.model_fields.items():
        if name == "attributes":
            continue
        alias = field.validation_alias
        names.append(str(alias.choices[0]) if alias is not None and hasattr(alias, "choices") else name.upper())
    return names + [f"ATTR_{name.upper()}" for name in AttributeNames.model_fields]


def environment(function: str) -> dict[str, Any]:
    found: dict[str, Any] = resources("AWS::Lambda::Function")[function]["Properties"]["Environment"]["Variables"]
    return found


def parameters_in(node: Any) -> set[str]:
    """The template parameters a value is made from (through Ref, Fn::If, Fn::Sub)."""
    names = set(source_template()["Parameters"])
    if isinstance(node, dict):
        if "Ref" in node:
            return {node["Ref"]} & names
        return set().union(*(parameters_in(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(parameters_in(value) for value in node))
    if isinstance(node, str):
        return {name for name in names if f"${{{name}}}" in node}
    return set()


def test_the_list_of_settings_without_a_parameter_names_only_real_settings() -> None:
    assert set(NOT_DEPLOYED) <= set(variables())
    assert not SESSION_SHAPE & set(NOT_DEPLOYED)


@pytest.mark.parametrize("variable", [v for v in variables() if v not in NOT_DEPLOYED])
def test_every_deployable_setting_is_set_from_a_parameter_on_some_function(variable: str) -> None:
    values = [environment(f)[variable] for f in resources("AWS::Lambda::Function") if variable in environment(f)]

    assert values, f"{variable}: no function sets it; add a template parameter (or say why in NOT_DEPLOYED)"


@pytest.mark.parametrize("function", FUNCTIONS)
def test_every_function_that_reads_sessions_has_every_setting_of_their_shape_from_parameters(function: str) -> None:
    env = environment(function)

    missing = sorted(SESSION_SHAPE - set(env))
    assert missing == [], f"{function} reads sessions without {missing}"
    assert all(parameters_in(env[variable]) for variable in SESSION_SHAPE)


def test_every_parameter_sits_in_a_parameter_group() -> None:
    template = source_template()
    grouped = {
        name
        for group in template["Metadata"]["AWS::CloudFormation::Interface"]["ParameterGroups"]
        for name in group["Parameters"]
    }

    assert sorted(set(template["Parameters"]) - grouped) == []


def test_a_kill_switch_without_the_extension_is_refused_by_a_rule() -> None:
    rule = source_template()["Rules"]["KillSwitchNeedsTheExtension"]

    [assertion] = rule["Assertions"]
    assert assertion["Assert"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "AppConfigExtensionLayerArn"}, ""]}]}
