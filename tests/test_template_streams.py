"""deploy/template.yaml: nothing ages out of the stream unseen. Alarms at 12 and 20 hours of the mapping's iterator
age, a stream check that alarms when the mapping reads another stream than the table's latest, and an optional
canary, each with a role that may make exactly its own calls."""

from __future__ import annotations

import json
from pathlib import Path

from tests.test_template import (
    LOGS,
    ROOT,
    as_list,
    function,
    granted,
    parameter,
    resources,
    source_template,
    statements,
)

HOUR_MS = 3600 * 1000


def alarm(name: str) -> dict:
    found: dict = resources("AWS::CloudWatch::Alarm")[name]
    return found


def test_the_mappings_oldest_waiting_record_alarms_at_12_and_20_hours() -> None:
    for name, hours in (("RecordAgeWarningAlarm", 12), ("RecordAgeCriticalAlarm", 20)):
        properties = alarm(name)["Properties"]
        assert (properties["Namespace"], properties["MetricName"], properties["Statistic"]) == (
            "AWS/Lambda",
            "IteratorAge",
            "Maximum",
        )
        assert properties["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": "CleanupFunction"}}]
        assert properties["Threshold"] == hours * HOUR_MS
        assert properties["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"


def source(path: str) -> str:
    return (ROOT / path).read_text()


def alarm_metrics(name: str) -> dict[str, dict]:
    return {m["Id"]: m["MetricStat"]["Metric"] for m in alarm(name)["Properties"]["Metrics"] if "MetricStat" in m}


def test_a_stream_check_compares_the_mapping_with_the_tables_latest_stream_every_15_minutes() -> None:
    check = function("worker.stream_check.handler")
    [rule] = [r for r in resources("AWS::Events::Rule").values() if "StreamCheckFunction" in json.dumps(r)]
    metrics = alarm_metrics("StreamChangedAlarm")

    assert check["Properties"]["Environment"]["Variables"]["EVENT_SOURCE_MAPPING_UUID"] == {
        "Ref": "CleanupFunctionSessionRemoved"
    }
    assert rule["Properties"]["ScheduleExpression"] == "rate(15 minutes)"
    assert metrics["changed"]["MetricName"] == "StreamChanged" and '"StreamChanged"' in source("worker/stream_check.py")
    assert metrics["errors"]["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": "StreamCheckFunction"}}]
    for name in ("StreamCheckFunction", "StreamCheckRole", "StreamChangedAlarm"):
        assert source_template()["Resources"][name]["Condition"] == "StreamCheckOn"
    assert source_template()["Conditions"]["StreamCheckOn"] == {"Fn::Not": [{"Condition": "KinesisSource"}]}


def test_the_stream_check_may_read_the_mapping_and_the_table_and_nothing_else() -> None:
    sids = {s["Sid"]: s for s in statements("StreamCheckRole")}

    assert granted("StreamCheckRole") == LOGS | {"lambda:GetEventSourceMapping", "dynamodb:DescribeTable"}
    assert sids["ReadMapping"]["Resource"]["Fn::Sub"].endswith(":event-source-mapping:${CleanupFunctionSessionRemoved}")
    assert sids["ReadLatestStream"]["Resource"]["Fn::Sub"].endswith(":table/${SessionTableName}")


def test_the_canary_exists_only_when_enabled_and_alarms_when_not_cleaned_in_time() -> None:
    canary = function("worker.canary.handler")
    variables = canary["Properties"]["Environment"]["Variables"]
    metrics = alarm_metrics("CanaryAlarm")

    assert parameter("CanaryEnabled")["Default"] == "false"
    for name in ("CanaryFunction", "CanaryRole", "CanaryLogGroup", "CanaryAlarm"):
        assert source_template()["Resources"][name]["Condition"] == "CanaryOn"
    assert variables["CANARY_GRANT_PRINCIPAL"] == {"Fn::GetAtt": ["CleanupRole", "Arn"]}
    assert variables["CANARY_TIMEOUT_SECONDS"] == {"Ref": "CanaryTimeoutSeconds"}
    assert parameter("CanaryTimeoutSeconds")["MaxValue"] < canary["Properties"]["Timeout"]
    assert metrics["uncleaned"]["MetricName"] == "CanaryNotCleaned"
    assert '"CanaryNotCleaned"' in source("cleanup/operations/canary.py")


def test_the_canary_writes_only_canary_sessions_and_grants_only_describe_key_to_the_worker() -> None:
    sids = {s["Sid"]: s for s in statements("CanaryRole", HasKeyPrefix=False)}
    role = {"Fn::GetAtt": ["CleanupRole", "Arn"]}

    assert granted("CanaryRole") == LOGS | {
        "dynamodb:PutItem",
        "dynamodb:DeleteItem",
        "dynamodb:DescribeTable",
        "kms:CreateGrant",
        "kms:ListGrants",
        "s3:PutObject",
        "s3:ListBucket",
    }
    leading = sids["WriteCanarySessions"]["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
    assert leading == [{"Fn::Sub": ["${Prefix}canary-*", {"Prefix": "session#"}]}]
    grant = sids["CreateCanaryGrant"]["Condition"]
    assert grant["StringEquals"] == {"kms:GranteePrincipal": role, "kms:RetiringPrincipal": role}
    assert grant["ForAllValues:StringEquals"] == {"kms:GrantOperations": ["DescribeKey"]}
    assert sids["PutCanaryObject"]["Resource"]["Fn::Sub"][0].endswith(":::${Bucket}/${ScratchRoot}canary*")
    assert sids["WatchCanaryObject"]["Condition"]["StringLike"] == {"s3:prefix": {"Fn::Sub": "${ScratchRoot}canary*"}}
    assert all("*" not in as_list(s["Resource"]) for s in sids.values())


def test_the_docs_name_every_new_alarm() -> None:
    operate = (Path(ROOT) / "docs" / "operate.md").read_text()
    for name in ("RecordAgeWarningAlarm", "RecordAgeCriticalAlarm", "StreamChangedAlarm", "CanaryAlarm"):
        assert f"`{name}`" in operate
