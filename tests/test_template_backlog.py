"""deploy/template.yaml's backlog: its defaults are the capacity model's lossless deployment, the drain is mapped to
a 14-day queue with a dead-letter queue it reaches only after days, only the cleanup role may send to it, and its age
is alarmed on and shown."""

from __future__ import annotations

import pytest

from benchmarks.capacity import DEFAULTS, Backlog, Mapping, Quotas
from cleanup.queues.backlog_drain import release_seconds
from tests.test_template import (
    attached,
    function,
    parameter,
    resolved,
    resources,
    statements,
    stream_mapping,
    transformed,
)

DAY = 86_400
BACKLOG_ARN = {"Fn::GetAtt": ["BacklogQueue", "Arn"]}


def queue(name: str) -> dict[str, object]:
    properties: dict[str, object] = transformed()["Resources"][name]["Properties"]
    return properties


def test_the_stream_mappings_defaults_are_the_models_lossless_ones() -> None:
    props = stream_mapping()["Properties"]
    model = Mapping()

    assert parameter("MaximumRecordAgeInSeconds")["Default"] == DEFAULTS.record_age == -1
    assert parameter("ParallelizationFactor")["Default"] == DEFAULTS.parallelization
    assert parameter("MaximumRetryAttempts")["Default"] == DEFAULTS.retry_attempts  # finite: a crash is not forever
    assert parameter("BatchSize")["Default"] == DEFAULTS.batch_size == model.batch_size
    assert function("worker.lambda_handler.handler")["Properties"]["Timeout"] == DEFAULTS.timeout
    assert parameter("BacklogMaximumConcurrency")["Default"] == Backlog().concurrency
    assert parameter("QuotaWaitSeconds")["Default"] == Backlog().quota_wait
    assert props["ParallelizationFactor"] == {"Ref": "ParallelizationFactor"}


def test_the_cleanup_function_defers_to_the_backlog_and_the_drain_does_not() -> None:
    stream = resolved(function("worker.lambda_handler.handler")["Properties"]["Environment"]["Variables"])
    drain = resolved(
        function("worker.backlog.handler")["Properties"]["Environment"]["Variables"], HasPreviousIntegrityKeys=True
    )

    assert stream["BACKLOG_QUEUE_URL"] == {"Ref": "BacklogQueue"}
    assert stream["QUOTA_WAIT_SECONDS"] == {"Ref": "QuotaWaitSeconds"}
    assert drain["BACKLOG_QUEUE_URL"] == {"Ref": "BacklogQueue"}  # only to release messages on
    assert "QUOTA_WAIT_SECONDS" not in drain  # the drain waits for its turns within its timeout
    assert set(stream) - set(drain) == {"QUOTA_WAIT_SECONDS"}  # the same cleanup otherwise
    # each drain environment starts at its share of the stream's learnt rate: one of the mapping's invocations at once
    assert drain["BACKLOG_MAXIMUM_CONCURRENCY"] == {"Ref": "BacklogMaximumConcurrency"}
    # and it verifies with the keys a rotation replaced, when there are any (the stream's function only tags)
    assert set(drain) - set(stream) == {"BACKLOG_MAXIMUM_CONCURRENCY", "INTEGRITY_PREVIOUS_KEY_IDS"}
    previous = resolved(drain["INTEGRITY_PREVIOUS_KEY_IDS"], HasPreviousIntegrityKeys=True)
    assert previous == {"Ref": "IntegrityPreviousKeyArns"}


def test_the_drain_runs_with_the_role_every_grant_names_as_retiring_principal() -> None:
    for handler in ("worker.lambda_handler.handler", "worker.backlog.handler"):
        assert function(handler)["Properties"]["Role"] == {"Fn::GetAtt": ["CleanupRole", "Arn"]}


def test_the_drain_is_mapped_to_the_backlog_with_partial_failures_and_a_small_concurrency() -> None:
    [mapping] = [
        m["Properties"]
        for m in resources("AWS::Lambda::EventSourceMapping").values()
        if m["Properties"]["EventSourceArn"] == BACKLOG_ARN
    ]

    assert mapping["FunctionName"] == {"Ref": "DrainFunction"}
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert mapping["ScalingConfig"] == {"MaximumConcurrency": {"Ref": "BacklogMaximumConcurrency"}}
    assert parameter("BacklogMaximumConcurrency")["MinValue"] == 2  # the least SQS allows
    assert mapping["BatchSize"] > 10 and mapping["MaximumBatchingWindowInSeconds"] >= 1  # needed above 10


def test_the_backlog_keeps_messages_14_days_and_hides_them_while_a_drain_may_run() -> None:
    backlog = queue("BacklogQueue")
    drain_timeout = function("worker.backlog.handler")["Properties"]["Timeout"]

    assert backlog["MessageRetentionPeriod"] == 14 * DAY
    assert backlog["VisibilityTimeout"] >= 6 * drain_timeout
    assert backlog["MaximumMessageSize"] == 1_048_576
    assert queue("BacklogDeadLetterQueue")["MessageRetentionPeriod"] == 14 * DAY


def test_a_message_failing_again_and_again_reaches_the_dead_letter_queue_after_days_with_days_to_spare() -> None:
    redrive = queue("BacklogQueue")["RedrivePolicy"]
    receives = redrive["maxReceiveCount"]  # type: ignore[index]
    hidden = sum(release_seconds(n) for n in range(1, receives))

    assert redrive["deadLetterTargetArn"] == {"Fn::GetAtt": ["BacklogDeadLetterQueue", "Arn"]}  # type: ignore[index]
    assert 3 * DAY < hidden < 7 * DAY  # days of retries, and a week of its 14 days left to fix and redrive


@pytest.mark.parametrize("operator", [True, False])
def test_only_the_cleanup_role_and_the_operator_may_send_to_the_backlog_queues(operator: bool) -> None:
    policy = resources("AWS::SQS::QueuePolicy")["BacklogQueuesPolicy"]["Properties"]
    role = {"Fn::GetAtt": ["CleanupRole", "Arn"]}
    arns = [BACKLOG_ARN, {"Fn::GetAtt": ["BacklogDeadLetterQueue", "Arn"]}]
    allow, deny, plain_http = policy["PolicyDocument"]["Statement"]
    assert plain_http["Sid"] == "NoPlainHttp"  # tests/test_template_least_privilege.py

    assert policy["Queues"] == [{"Ref": "BacklogQueue"}, {"Ref": "BacklogDeadLetterQueue"}]
    assert (allow["Effect"], allow["Principal"], allow["Action"], allow["Resource"]) == (
        "Allow",
        {"AWS": role},
        "sqs:SendMessage",
        arns,
    )
    assert (deny["Effect"], deny["Principal"], deny["Action"], deny["Resource"]) == (
        "Deny",
        "*",
        "sqs:SendMessage",
        arns,
    )
    allowed = [role, {"Ref": "OperatorRoleArn"}] if operator else role  # the operator: cleanup-worker retag
    assert resolved(deny["Condition"], HasOperatorRole=operator) == {"ArnNotEquals": {"aws:PrincipalArn": allowed}}


def test_the_role_sends_receives_and_reads_stored_records_only_where_the_backlog_is() -> None:
    by_sid = {s["Sid"]: s for s in attached("CleanupRole")}

    assert by_sid["DeferToBacklog"]["Resource"] == BACKLOG_ARN
    assert by_sid["DrainBacklog"]["Resource"] == BACKLOG_ARN
    assert by_sid["ReleaseBacklog"]["Resource"] == BACKLOG_ARN
    assert by_sid["ReleaseBacklog"]["Action"] == "sqs:ChangeMessageVisibility"
    stored = by_sid["DrainStoredRecords"]["Resource"]["Fn::Sub"][0]
    assert stored.endswith(":::${Bucket}/${DeadLetterPrefix}*")


def test_the_backlogs_age_and_its_dead_letters_have_alarms() -> None:
    alarms = resources("AWS::CloudWatch::Alarm")
    age, dead = alarms["BacklogAgeAlarm"]["Properties"], alarms["BacklogDeadLetterQueueAlarm"]["Properties"]

    assert (age["Namespace"], age["MetricName"]) == ("AWS/SQS", "ApproximateAgeOfOldestMessage")
    assert age["Dimensions"] == [{"Name": "QueueName", "Value": {"Fn::GetAtt": ["BacklogQueue", "QueueName"]}}]
    assert age["Threshold"] == {"Ref": "BacklogAgeAlarmSeconds"}
    assert parameter("BacklogAgeAlarmSeconds")["MaxValue"] <= 14 * DAY  # it fires before anything could expire
    assert dead["Dimensions"][0]["Value"] == {"Fn::GetAtt": ["BacklogDeadLetterQueue", "QueueName"]}
    assert (dead["MetricName"], dead["Threshold"]) == ("ApproximateNumberOfMessagesVisible", 0)


def test_the_sweeper_holds_back_while_the_backlog_is_deep_or_a_minutes_deletes_are_done() -> None:
    sweeper = resolved(function("worker.sweep.handler")["Properties"]["Environment"]["Variables"])
    [depth] = [s for s in statements("SweeperRole") if s["Sid"] == "BacklogDepth"]

    assert sweeper["BACKLOG_QUEUE_URL"] == {"Ref": "BacklogQueue"}
    assert sweeper["SWEEP_MAX_BACKLOG"] == {"Ref": "SweepMaxBacklog"}
    assert sweeper["SWEEP_MAX_DELETES"] == {"Ref": "SweepMaxDeletes"}
    assert (depth["Action"], depth["Resource"]) == ("sqs:GetQueueAttributes", BACKLOG_ARN)
    # the backlog the sweeper stops at drains within its retention at the default RetireGrant quota, with room
    assert parameter("SweepMaxBacklog")["Default"] / Quotas().kms < DAY
