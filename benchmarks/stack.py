"""One deployment of deploy/template.yaml, without deploying it: the parameter values of an example (its
``samconfig.toml`` over the template's defaults), the conditions they decide, the resources that exist, and any
node of the template with its intrinsic functions evaluated as CloudFormation would.

What it cannot know (an attribute of a resource made at deploy time, a pseudo parameter) is given a placeholder:
``<LogicalId.Attribute>``, or the value in ``PSEUDO``. The tests use it to hold each example to what it creates; the
cost model (``benchmarks.stack_costs``) counts what it creates.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "deploy" / "template.yaml"
EXAMPLES = sorted((ROOT / "deploy" / "examples").glob("*/samconfig.toml"))
PSEUDO = {
    "AWS::Region": "eu-west-1",
    "AWS::URLSuffix": "amazonaws.com",
    "AWS::Partition": "aws",
    "AWS::AccountId": "123456789012",
    "AWS::StackName": "cleanup",
}


class _NoValue:
    """``AWS::NoValue``: left out of the list or property it stands in."""

    def __repr__(self) -> str:
        return "NO_VALUE"


NO_VALUE: Any = _NoValue()


@cache
def source_template() -> dict[str, Any]:
    """The template as written (short-form tags read as their long form)."""
    from cfnlint.decode import decode  # type: ignore[import-untyped]  # the test extra's: tests and cost tables

    template, problems = decode(str(TEMPLATE))
    if problems or template is None:
        raise ValueError(f"{TEMPLATE}: {problems}")
    loaded: dict[str, Any] = json.loads(json.dumps(template))
    return loaded


def overrides(example: Path) -> dict[str, str]:
    """An example's ``parameter_overrides``, by parameter."""
    text = tomllib.loads(example.read_text())["default"]["deploy"]["parameters"]["parameter_overrides"]
    return dict(pair.split("=", 1) for pair in str(text).split())


class Stack:
    """The template evaluated for one set of parameter values (``Stack.of(example)`` for an example's)."""

    def __init__(self, values: dict[str, str]) -> None:
        self.template = source_template()
        defaults = {name: str(p.get("Default", "")) for name, p in self.template["Parameters"].items()}
        self.values = defaults | values

    @classmethod
    def of(cls, example: Path) -> Stack:
        return cls(overrides(example))

    def condition(self, name: str) -> bool:
        return bool(self(self.template["Conditions"][name]))

    def resources(self) -> dict[str, dict[str, Any]]:
        """The resources this deployment creates (their conditions hold), as written."""
        found = self.template["Resources"].items()
        return {name: r for name, r in found if "Condition" not in r or self.condition(r["Condition"])}

    def of_type(self, kind: str) -> dict[str, dict[str, Any]]:
        return {name: r for name, r in self.resources().items() if r["Type"] == kind}

    def outputs(self) -> dict[str, Any]:
        found = self.template["Outputs"].items()
        return {name: self(o["Value"]) for name, o in found if "Condition" not in o or self.condition(o["Condition"])}

    def environment(self, function: str) -> dict[str, str]:
        """The environment ``function`` runs with (the template's Globals and its own variables)."""
        variables = {
            **self.template["Globals"]["Function"]["Environment"]["Variables"],
            **self.template["Resources"][function]["Properties"]["Environment"]["Variables"],
        }
        resolved = {name: self(value) for name, value in variables.items()}
        return {name: str(value) for name, value in resolved.items() if value is not NO_VALUE}

    def concrete(self) -> dict[str, Any]:
        """The template as this deployment has it: its parameters' defaults set to its values, every condition
        decided (``Fn::If`` replaced by its branch, resources and outputs whose condition fails left out), every other
        intrinsic function kept, so that a linter checks what this deployment would run."""
        template: dict[str, Any] = json.loads(json.dumps(self.template))
        for name, parameter in template["Parameters"].items():
            if self.values[name] != str(parameter.get("Default", "")):
                parameter["Default"] = self.values[name]
        template["Globals"] = self.decided(template["Globals"])
        for section in ("Resources", "Outputs"):
            kept = {}
            for name, node in template[section].items():
                if "Condition" in node and not self.condition(node.pop("Condition")):
                    continue
                kept[name] = self.decided(node)
            template[section] = kept
        template.pop("Conditions", None)
        return template

    def decided(self, node: Any) -> Any:
        """``node`` with each ``Fn::If`` replaced by the branch its condition takes (``AWS::NoValue`` left out)."""
        if isinstance(node, list):
            return [value for value in map(self.decided, node) if value is not NO_VALUE]
        if not isinstance(node, dict):
            return node
        if set(node) == {"Fn::If"}:
            return self.decided(node["Fn::If"][1] if self.condition(node["Fn::If"][0]) else node["Fn::If"][2])
        if node == {"Ref": "AWS::NoValue"}:
            return NO_VALUE
        kept = {key: self.decided(value) for key, value in node.items()}
        return {key: value for key, value in kept.items() if value is not NO_VALUE}

    def __call__(self, node: Any) -> Any:
        """``node`` with every intrinsic function evaluated."""
        if isinstance(node, list):
            return [value for value in map(self, node) if value is not NO_VALUE]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            [(name, argument)] = node.items()
            function = _FUNCTIONS.get(name)
            if function is not None:
                return function(self, argument)
        kept = {key: self(value) for key, value in node.items()}
        return {key: value for key, value in kept.items() if value is not NO_VALUE}

    def ref(self, name: str) -> Any:
        if name == "AWS::NoValue":
            return NO_VALUE
        if name in self.values:
            return self.values[name]
        return PSEUDO.get(name, f"<{name}>")

    def sub(self, argument: Any) -> str:
        text, local = (argument, {}) if isinstance(argument, str) else (argument[0], self(argument[1]))
        return re.sub(r"\$\{([^}!]+)\}", lambda m: str(local.get(m[1], self._named(m[1]))), text)

    def _named(self, name: str) -> Any:
        return f"<{name}>" if "." in name else self.ref(name)


def _if(stack: Stack, argument: list[Any]) -> Any:
    return stack(argument[1] if stack.condition(argument[0]) else argument[2])


def _getatt(stack: Stack, argument: Any) -> str:
    return f"<{'.'.join(argument) if isinstance(argument, list) else argument}>"


_FUNCTIONS: dict[str, Callable[[Stack, Any], Any]] = {
    "Ref": lambda stack, name: stack.ref(name),
    "Condition": lambda stack, name: stack.condition(name),
    "Fn::If": _if,
    "Fn::Equals": lambda stack, pair: str(stack(pair[0])) == str(stack(pair[1])),
    "Fn::Not": lambda stack, one: not stack(one[0]),
    "Fn::And": lambda stack, many: all(map(stack, many)),
    "Fn::Or": lambda stack, many: any(map(stack, many)),
    "Fn::GetAtt": _getatt,
    "Fn::Sub": lambda stack, argument: stack.sub(argument),
    "Fn::Join": lambda stack, argument: str(argument[0]).join(str(part) for part in stack(argument[1])),
    "Fn::Split": lambda stack, argument: str(stack(argument[1])).split(str(argument[0])),
    "Fn::Select": lambda stack, argument: stack(argument[1])[int(stack(argument[0]))],
}
