"""The operator dashboard: every widget watches a metric the worker really emits, under the namespace, name and
dimensions it is emitted with, and together they answer the questions the docs (docs/lambda.md) say they answer.

What the worker emits is read from its code (every literal metric name handed to ``Metrics.count`` or
``Metrics.observe``, with its dimension) and the dimensions each one carries from ``cleanup.telemetry`` itself (an EMF
document is written and read back): a metric emitted with a dimension exists in CloudWatch only with that dimension
set, so a widget naming another set would show nothing.
"""

from __future__ import annotations

import ast
import io
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from cleanup.actions import connection, grant, registry, scratch
from cleanup.expiry.sweeper import Verdict
from cleanup.killswitch import Mode
from cleanup.telemetry import Metrics, MetricsSink
from schemas.outcomes import Reason
from schemas.settings import Settings
from tests.test_template import resolved, source_template, transformed

ROOT = Path(__file__).resolve().parent.parent
LAMBDA_PAGE = (ROOT / "docs" / "lambda.md").read_text()
NAMESPACE, SERVICE = "Namespace-Under-Test", "service-under-test"
SUBSTITUTIONS = {
    "AWS::Region": "eu-west-1",
    "MetricsNamespace": NAMESPACE,
    "ServiceName": SERVICE,
    "CleanupFunction": "cleanup-function",
    "DeadLetterQueue.QueueName": "dead-letter-queue",
    "OnFailureQueue.QueueName": "on-failure-queue",
    "IteratorAgeAlarmMilliseconds": "300000",
    "BacklogQueue.QueueName": "backlog-queue",
    "BacklogDeadLetterQueue.QueueName": "backlog-dead-letter-queue",
    "BacklogAgeAlarmSeconds": "86400",
    "CleanupFunctionSessionRemoved": "stream-mapping-uuid",
    "BacklogDrainMapping": "backlog-mapping-uuid",
}
ACTIONS = {connection.ACTION, grant.ACTION, scratch.ACTION, registry.ACTION}
# The values each dimension of the worker's metrics can take.
DIMENSION_VALUES = {
    "Reason": {reason.value for reason in Reason},
    "Action": ACTIONS,
    "Verdict": {verdict.value for verdict in Verdict},
    "Mode": {mode.value for mode in Mode},
}


@dataclass(frozen=True)
class Line:
    """One metric of one widget."""

    widget: str
    namespace: str
    name: str
    dimensions: dict[str, str]
    stat: str | None


@cache
def dashboard(messages: bool = True, switch: bool = True) -> dict[str, Any]:
    """The dashboard's body for a stack with (or without) the messages' machinery and a kill switch, its widgets
    joined and ``${...}`` substitutions made (an unknown one fails here)."""
    node = resolved(
        transformed()["Resources"]["Dashboard"]["Properties"]["DashboardBody"],
        MessagesOn=messages,
        HasKillSwitch=switch,
    )
    parsed: dict[str, Any] = json.loads(joined(node))
    return parsed


def joined(node: Any) -> str:
    """A resolved ``Fn::Join`` of ``Fn::Sub`` strings, as CloudFormation makes it."""
    if isinstance(node, str):
        return node
    if "Fn::Join" in node:
        separator, parts = node["Fn::Join"]
        return str(separator).join(joined(part) for part in parts)
    body = node["Fn::Sub"]
    assert set(re.findall(r"\$\{([^}]+)\}", body)) <= set(SUBSTITUTIONS)
    return re.sub(r"\$\{([^}]+)\}", lambda m: SUBSTITUTIONS[m.group(1)], body)


def expressions(**stack: bool) -> list[str]:
    """The metric math expressions of the widgets."""
    found = []
    for widget in dashboard(**stack)["widgets"]:
        found += [m[0]["expression"] for m in widget["properties"]["metrics"] if "expression" in m[0]]
    return found


def lines(**stack: bool) -> list[Line]:
    found = []
    for widget in dashboard(**stack)["widgets"]:
        properties = widget["properties"]
        for metric in properties["metrics"]:
            options = metric[-1] if isinstance(metric[-1], dict) else {}
            fields = [part for part in metric if not isinstance(part, dict)]
            if not fields:  # an expression: expressions()
                continue
            namespace, name, pairs = fields[0], fields[1], fields[2:]
            dimensions = dict(zip(pairs[::2], pairs[1::2], strict=True))
            stat = options.get("stat", properties.get("stat"))
            found.append(Line(properties["title"], namespace, name, dimensions, stat))
    return found


def ours() -> list[Line]:
    return [line for line in lines() if line.namespace == NAMESPACE]


@cache
def emitted() -> dict[str, str]:
    """Every metric the worker's code emits (a literal name given to ``count`` or ``observe``) and the dimension it
    is emitted with ('' for none)."""
    found: dict[str, str] = {}
    for path in [*ROOT.joinpath("cleanup").rglob("*.py"), *ROOT.joinpath("worker").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            literals = [arg.value if isinstance(arg, ast.Constant) else None for arg in node.args]
            name = literals[0] if literals else None
            if node.func.attr not in ("count", "observe") or not isinstance(name, str):
                continue
            if re.fullmatch(r"[A-Z][A-Za-z]+", name):
                dimension = literals[1] if node.func.attr == "count" and len(literals) > 1 else ""
                assert found.get(name, dimension) == dimension, f"{name} is emitted with two dimensions"
                found[name] = str(dimension or "")
    return found


def emf_dimensions(name: str, dimension: str) -> list[set[str]]:
    """The dimension sets ``cleanup.telemetry`` writes for ``name``, read back from the EMF document it writes."""
    out = io.StringIO()
    settings = Settings(metrics_namespace=NAMESPACE, service_name=SERVICE)
    metrics = Metrics(settings, MetricsSink("stdout", stream=out))
    if dimension:
        metrics.count(name, dimension, "value")
    else:
        metrics.observe(name, 1.0)
    metrics.flush()
    [document] = [json.loads(line) for line in out.getvalue().splitlines()]
    [directive] = document["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == NAMESPACE and document["Service"] == SERVICE
    return [set(dimensions) for dimensions in directive["Dimensions"]]


def test_the_code_scan_finds_the_metrics_the_alarms_already_watch() -> None:
    assert {"SessionsCleaned", "RecordsFailed", "RecordsDeadLettered", "ActionFailures", "SweepLagSeconds"} <= set(
        emitted()
    )
    assert emitted()["SessionsCleaned"] == "Reason" and emitted()["ActionFailures"] == "Action"


def test_every_worker_metric_on_the_dashboard_is_emitted_with_exactly_those_dimensions() -> None:
    assert ours()
    for line in ours():
        assert line.name in emitted(), f"{line.widget}: {line.name} is not a metric the worker emits"
        assert set(line.dimensions) in emf_dimensions(line.name, emitted()[line.name]), line
        assert line.dimensions["Service"] == SERVICE


def test_dimension_values_are_ones_the_worker_emits() -> None:
    for line in ours():
        for dimension, value in line.dimensions.items():
            if dimension != "Service":
                assert value in DIMENSION_VALUES[dimension], line


def test_sessions_cleaned_by_every_reason() -> None:
    cleaned = [line for line in ours() if line.name == "SessionsCleaned"]

    assert {line.dimensions["Reason"] for line in cleaned} == {reason.value for reason in Reason}
    assert {line.stat for line in cleaned} == {"Sum"}


def test_ttl_lag_at_p50_and_p99_and_the_sweepers_lag() -> None:
    stats = {(line.name, line.stat) for line in ours()}

    assert {("TtlLagSeconds", "p50"), ("TtlLagSeconds", "p99")} <= stats
    assert any(name == "SweepLagSeconds" for name, _ in stats)


def test_records_failed_dead_lettered_and_failures_of_every_action_by_any_name() -> None:
    names = {line.name for line in ours()}
    summed = [line for line in ours() if line.name == "ActionFailures"]
    [search] = [e for e in expressions() if "ActionFailures" in e]

    assert {"RecordsFailed", "RecordsDeadLettered"} <= names
    assert [line.dimensions for line in summed] == [{"Service": SERVICE}]  # every action, as the alarm counts them
    # and each action by its own name, whatever it is (http-close, an installed kind): a search over the dimension
    assert search.startswith(f'SEARCH(\'{{{NAMESPACE},Action,Service}} MetricName="ActionFailures"')
    assert f'Service="{SERVICE}"' in search and {"Action", "Service"} in emf_dimensions("ActionFailures", "Action")


def test_the_mappings_iterator_age_and_both_queues() -> None:
    others = {(line.namespace, line.name, tuple(sorted(line.dimensions.items()))) for line in lines()}

    assert ("AWS/Lambda", "IteratorAge", (("FunctionName", "cleanup-function"),)) in others
    for queue in ("dead-letter-queue", "on-failure-queue"):
        assert ("AWS/SQS", "ApproximateNumberOfMessagesVisible", (("QueueName", queue),)) in others


def test_the_mappings_own_counts_of_what_left_without_the_worker() -> None:
    others = {(line.namespace, line.name, tuple(sorted(line.dimensions.items()))) for line in lines()}

    for name, mapping in [
        ("OnFailureDestinationDeliveredEventCount", "stream-mapping-uuid"),
        ("DroppedEventCount", "stream-mapping-uuid"),
        ("DroppedEventCount", "backlog-mapping-uuid"),
    ]:
        assert ("AWS/Lambda", name, (("EventSourceMappingUUID", mapping),)) in others


def test_both_mappings_count_their_events_and_alarm_on_what_needs_a_redrive_or_was_dropped() -> None:
    template = source_template()
    mappings = ("CleanupFunctionSessionRemoved", "BacklogDrainMapping")
    alarms = {
        (a["Properties"]["MetricName"], a["Properties"]["Dimensions"][0]["Value"]["Ref"])
        for a in template["Resources"].values()
        if a["Type"] == "AWS::CloudWatch::Alarm"
        and a["Properties"].get("Namespace") == "AWS/Lambda"
        and a["Properties"]["Dimensions"][0]["Name"] == "EventSourceMappingUUID"
    }

    for mapping in mappings:
        assert template["Resources"][mapping]["Properties"]["MetricsConfig"] == {"Metrics": ["EventCount"]}
        assert ("DroppedEventCount", mapping) in alarms
    assert ("OnFailureDestinationDeliveredEventCount", "CleanupFunctionSessionRemoved") in alarms


def test_the_deploy_page_says_what_each_widget_answers() -> None:
    section = LAMBDA_PAGE[LAMBDA_PAGE.index("## The dashboard") :]
    for widget in dashboard()["widgets"]:
        question = widget["properties"]["title"].split(": ", 1)[1]
        assert question in section, question


def test_every_mode_of_the_kill_switch_and_paused_batches() -> None:
    modes = {line.dimensions["Mode"] for line in ours() if line.name == "ModeChanges"}

    assert modes == {mode.value for mode in Mode}
    assert "PausedBatches" in {line.name for line in ours()}


def test_the_backlogs_deferred_records_depth_and_age() -> None:
    others = {(line.namespace, line.name, tuple(sorted(line.dimensions.items()))) for line in lines()}

    assert "RecordsDeferred" in {line.name for line in ours()}
    for name in ("ApproximateNumberOfMessagesVisible", "ApproximateAgeOfOldestMessage"):
        assert ("AWS/SQS", name, (("QueueName", "backlog-queue"),)) in others
    assert ("AWS/SQS", "ApproximateNumberOfMessagesVisible", (("QueueName", "backlog-dead-letter-queue"),)) in others


def test_the_paused_alarm_watches_what_the_kill_switch_emits_with_exactly_those_dimensions() -> None:
    alarm = transformed()["Resources"]["KillSwitchPausedAlarm"]["Properties"]
    stats = [m["MetricStat"]["Metric"] for m in alarm["Metrics"] if "MetricStat" in m]

    for stat in stats:
        name = stat["MetricName"]
        dimensions = {d["Name"]: d["Value"] for d in stat["Dimensions"]}
        assert name in emitted() and set(dimensions) in emf_dimensions(name, emitted()[name])
        assert all(dimensions[d] in DIMENSION_VALUES[d] for d in set(dimensions) - {"Service"})
    assert {"Name": "Mode", "Value": Mode.PAUSED.value} in [d for s in stats for d in s["Dimensions"]]


def test_a_socket_only_stack_has_no_widget_of_what_it_does_not_create() -> None:
    # Without the messages' machinery there is no backlog, drain or dead-letter queue: no widget may name them (a
    # ${...} of a resource the stack lacks would fail the deployment), nor the kill switch without one.
    others = {(line.namespace, line.name, tuple(sorted(line.dimensions.items()))) for line in lines(messages=False)}
    titles = [widget["properties"]["title"] for widget in dashboard(messages=False, switch=False)["widgets"]]

    assert ("AWS/SQS", "ApproximateNumberOfMessagesVisible", (("QueueName", "on-failure-queue"),)) in others
    assert not {name for _, _, dims in others for _, name in dims} & {
        "dead-letter-queue",
        "backlog-queue",
        "backlog-dead-letter-queue",
        "backlog-mapping-uuid",
    }
    assert not [title for title in titles if title.startswith(("Backlog", "Kill switch"))]
    assert len(titles) == len(dashboard()["widgets"]) - 2
