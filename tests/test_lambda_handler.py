"""The Lambda entry point end to end: real stream records from moto, cleaned by the core, answered as Lambda wants."""

from __future__ import annotations

import json

import boto3
import pytest

from cleanup.actions import scratch
from cleanup.queues.reporting import run_batch
from schemas.outcomes import ActionStatus, Reason, Status
from schemas.records import read_lambda_event
from tests.faults import Faults
from tests.stack import SessionStack
from worker import lambda_handler


@pytest.fixture
def invoke(stack: SessionStack):
    def call(event: dict, **settings: object) -> dict:
        with lambda_handler.warm.use(stack.runtime(**settings)):
            return lambda_handler.handler(event, None)

    return call


def outcomes_of(stack: SessionStack, event: dict, **settings: object):
    return run_batch(read_lambda_event(event), stack.runtime(**settings))


def test_ttl_explicit_and_expired_deletes_are_all_cleaned_with_their_reason(stack: SessionStack) -> None:
    by_ttl = stack.put_session("ttl", ttl=1_000)
    explicit = stack.put_session("explicit")
    swept = stack.put_session("swept", ttl=2_000)
    stack.expire("ttl")
    stack.delete("explicit")
    stack.delete("swept")

    outcomes = [o for o in outcomes_of(stack, stack.lambda_event()) if o.event_name == "REMOVE"]

    assert [(o.status, o.reason) for o in outcomes] == [
        (Status.CLEANED, Reason.TTL),
        (Status.CLEANED, Reason.EXPLICIT),
        (Status.CLEANED, Reason.EXPIRED),
    ]
    assert outcomes[0].ttl_lag_seconds is not None and outcomes[0].ttl_lag_seconds > 0
    for item in (by_ttl, explicit, swept):
        assert stack.objects(item["scratchPrefix"]) == []
        assert item["grantId"] not in stack.grant_ids()


def test_inserts_and_modifies_are_skipped_and_change_nothing(stack: SessionStack, invoke) -> None:
    item = stack.put_session("live")
    stack.put_item({**item, "ttl": item["ttl"] + 60})

    event = stack.lambda_event()
    outcomes = outcomes_of(stack, event)

    assert [o.status for o in outcomes] == [Status.SKIPPED, Status.SKIPPED]
    assert invoke(event) == {"batchItemFailures": []}
    assert len(stack.objects(item["scratchPrefix"])) == 3
    assert item["grantId"] in stack.grant_ids()


@pytest.mark.slow
def test_a_large_prefix_is_deleted_page_by_page(stack: SessionStack, invoke, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scratch, "PAGE", 100)  # two and a half pages, as 2,500 objects are at S3's 1,000 a page
    item = stack.put_session("big", objects=250)
    sentinel = stack.put_session("bigger", objects=2, grant=False)  # shares the first characters of the prefix
    stack.delete("big")

    assert invoke(stack.lambda_event()) == {"batchItemFailures": []}
    assert stack.objects(item["scratchPrefix"]) == []
    assert len(stack.objects(sentinel["scratchPrefix"])) == 2


def test_every_version_and_delete_marker_of_a_versioned_bucket_is_deleted(aws, request, invoke) -> None:
    stack = SessionStack.create(aws, request.node.name, versioned=True)
    item = stack.put_session("v", objects=3)
    prefix = item["scratchPrefix"]
    stack.s3.put_object(Bucket=stack.bucket, Key=f"{prefix}part-00000", Body=b"second version")
    stack.s3.delete_object(Bucket=stack.bucket, Key=f"{prefix}part-00001")  # leaves a delete marker
    keep = stack.put_session("keep", objects=1, grant=False)
    stack.delete("v")

    outcomes = outcomes_of(stack, stack.lambda_event())

    assert outcomes[-1].status is Status.CLEANED
    assert outcomes[-1].actions[-1].detail["versions"] == 5
    assert stack.versions(prefix) == 0
    assert stack.versions(keep["scratchPrefix"]) == 1


def test_a_per_key_delete_error_fails_the_record_and_is_never_ignored(aws, request) -> None:
    stack = SessionStack.create(aws, request.node.name)
    s3 = stack.s3
    locked_bucket = f"{stack.bucket}-lock"
    s3.create_bucket(Bucket=locked_bucket, ObjectLockEnabledForBucket=True)
    stack.bucket = locked_bucket
    item = stack.put_session("held", objects=3)
    s3.put_object_legal_hold(Bucket=locked_bucket, Key=f"{item['scratchPrefix']}part-00001", LegalHold={"Status": "ON"})
    stack.delete("held")

    outcome = outcomes_of(stack, stack.lambda_event())[-1]

    assert outcome.status is Status.FAILED
    assert outcome.permanent
    assert "AccessDenied" in (outcome.error or "")
    assert stack.objects(item["scratchPrefix"]) == [f"{item['scratchPrefix']}part-00001"]
    assert item["grantId"] not in stack.grant_ids()  # the other actions still ran


@pytest.mark.parametrize(
    "prefix",
    ["", "sessions/", "sessions/../other/", "s3://elsewhere/sessions/t1/x/", "other/t1/x/", "sessions/t1"],
)
def test_the_guard_refuses_unsafe_prefixes_and_deletes_nothing(stack: SessionStack, invoke, prefix: str) -> None:
    sentinels = ["sessions/t2/live/a", "other/t1/x/b", "sessions/keep", "sessions/t1x/c"]
    for key in sentinels:
        stack.s3.put_object(Bucket=stack.bucket, Key=key, Body=b"sentinel")
    item = stack.put_session("evil", objects=0, extra={"scratchPrefix": prefix})
    stack.delete("evil")
    event = stack.lambda_event()

    result = invoke(event)
    outcome = outcomes_of(stack, event)[-1]

    assert result == {"batchItemFailures": [{"itemIdentifier": event["Records"][-1]["dynamodb"]["SequenceNumber"]}]}
    assert outcome.permanent
    assert sorted(stack.objects()) == sorted(sentinels)
    assert item["grantId"] not in stack.grant_ids()  # the socket and grant are still the session's own


def test_retiring_a_grant_twice_succeeds(stack: SessionStack, invoke) -> None:
    item = stack.put_session("g")
    stack.delete("g")
    event = stack.lambda_event()

    assert invoke(event) == {"batchItemFailures": []}
    assert item["grantId"] not in stack.grant_ids()
    assert invoke(event) == {"batchItemFailures": []}


def test_a_grant_with_no_known_key_is_a_permanent_failure(stack: SessionStack) -> None:
    item = stack.put_session("nokey")
    stack.delete("nokey")

    outcome = outcomes_of(stack, stack.lambda_event(), kms_key_id=None)[-1]

    assert outcome.status is Status.FAILED and outcome.permanent
    assert "KMS_KEY_ID" in (outcome.error or "")
    assert item["grantId"] in stack.grant_ids()
    assert stack.objects(item["scratchPrefix"]) == []


def test_a_reconnected_session_keeps_what_it_still_holds(stack: SessionStack) -> None:
    old = stack.put_session("re", connection_id="conn-1=")
    stack.delete("re")
    new_prefix = "sessions/t1/re-2/"
    stack.s3.put_object(Bucket=stack.bucket, Key=f"{new_prefix}a", Body=b"live")
    stack.put_item({**old, "scratchPrefix": new_prefix})  # same key, same grant and socket, new scratch
    event = stack.lambda_event()

    remove = next(o for o in outcomes_of(stack, event) if o.event_name == "REMOVE")

    statuses = {a.action: a.status for a in remove.actions}
    assert statuses == {"connection": ActionStatus.KEPT, "grant": ActionStatus.KEPT, "scratch": ActionStatus.DONE}
    assert old["grantId"] in stack.grant_ids()
    assert stack.objects(old["scratchPrefix"]) == []
    assert stack.objects(new_prefix) == [f"{new_prefix}a"]


def test_throttling_is_retried_until_the_grant_is_retired(stack: SessionStack) -> None:
    item = stack.put_session("slow")
    stack.delete("slow")
    runtime = stack.runtime(botocore_max_attempts=2, retry_attempts=4)
    faults = Faults(runtime.clients.kms, "RetireGrant", "ThrottlingException", times=3)

    outcome = run_batch(read_lambda_event(stack.lambda_event()), runtime)[-1]

    assert outcome.status is Status.CLEANED
    assert faults.sent == 4  # botocore retried once, then the worker's own backoff retried
    assert item["grantId"] not in stack.grant_ids()


def test_throttling_that_outlasts_the_retries_reports_the_record(stack: SessionStack) -> None:
    item = stack.put_session("throttled")
    stack.delete("throttled")
    runtime = stack.runtime(botocore_max_attempts=1, retry_attempts=2)
    Faults(runtime.clients.kms, "RetireGrant", "ThrottlingException", times=10)

    outcome = run_batch(read_lambda_event(stack.lambda_event()), runtime)[-1]

    assert outcome.status is Status.FAILED and not outcome.permanent
    assert item["grantId"] in stack.grant_ids()
    assert stack.objects(item["scratchPrefix"]) == []


def test_later_records_of_a_failed_key_wait_in_stream_order(stack: SessionStack) -> None:
    first = stack.put_session("k", extra={"kmsKeyId": "arn:aws:kms:us-east-1:123456789012:key/missing"})
    stack.delete("k")
    second = stack.put_session("k", grant=False, extra={"scratchPrefix": "sessions/t1/k-2/"})
    stack.s3.put_object(Bucket=stack.bucket, Key="sessions/t1/k-2/a", Body=b"x")
    stack.delete("k")
    other = stack.put_session("other")
    stack.delete("other")

    outcomes = outcomes_of(stack, stack.lambda_event())
    removes = [o for o in outcomes if o.event_name == "REMOVE"]

    assert [o.status for o in removes] == [Status.FAILED, Status.FAILED, Status.CLEANED]
    assert "not attempted" in (removes[1].error or "")
    assert stack.objects("sessions/t1/k-2/") == ["sessions/t1/k-2/a"]  # the later record did not run
    assert stack.objects(other["scratchPrefix"]) == []
    assert first["grantId"] in stack.grant_ids()
    del second


def test_the_same_batch_three_times_ends_in_the_same_state(stack: SessionStack, invoke) -> None:
    items = [stack.put_session(f"s{n}") for n in range(5)]
    live = stack.put_session("live")
    for n in range(5):
        stack.delete(f"s{n}")
    event = stack.lambda_event()

    results = [invoke(event) for _ in range(3)]

    assert results == [{"batchItemFailures": []}] * 3
    assert all(stack.objects(i["scratchPrefix"]) == [] for i in items)
    assert stack.grant_ids() == {live["grantId"]}
    assert len(stack.objects(live["scratchPrefix"])) == 3


def test_permanent_failures_go_to_the_dead_letter_queue_whole(stack: SessionStack, invoke) -> None:
    sqs = boto3.client("sqs", region_name="us-east-1")
    queue = sqs.create_queue(QueueName=f"dlq-{stack.table}")["QueueUrl"]
    stack.put_session("poison", objects=0, extra={"scratchPrefix": "sessions/../etc/"})
    stack.delete("poison")
    event = stack.lambda_event()

    assert invoke(event, dead_letter_queue_url=queue) == {"batchItemFailures": []}

    messages = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)["Messages"]
    body = json.loads(messages[0]["Body"])
    assert len(messages) == 1
    assert body["record"] == event["Records"][-1]
    assert "not end" in body["error"] or "segment" in body["error"]


def test_a_malformed_record_is_reported_and_the_rest_of_the_batch_is_cleaned(stack: SessionStack, invoke) -> None:
    item = stack.put_session("fine")
    stack.delete("fine")
    event = stack.lambda_event()
    bad = json.loads(json.dumps(event["Records"][-1]))
    bad["dynamodb"]["SequenceNumber"] = "9" * 21
    bad["dynamodb"]["OldImage"]["ttl"] = {"N": "NaN"}
    event["Records"].append(bad)

    assert invoke(event) == {"batchItemFailures": [{"itemIdentifier": "9" * 21}]}
    assert stack.objects(item["scratchPrefix"]) == []


def test_a_record_without_a_readable_sequence_number_fails_the_invocation(stack: SessionStack, invoke) -> None:
    stack.put_session("x")
    stack.delete("x")
    event = stack.lambda_event()
    del event["Records"][-1]["dynamodb"]["SequenceNumber"]

    with pytest.raises(ValueError, match="sequence number"):
        invoke(event)


def test_dry_run_changes_nothing(stack: SessionStack) -> None:
    item = stack.put_session("dry")
    stack.delete("dry")

    outcome = outcomes_of(stack, stack.lambda_event(), cleanup_mode="dry-run")[-1]

    assert outcome.status is Status.PLANNED
    assert {a.status for a in outcome.actions} == {ActionStatus.PLANNED}
    assert outcome.actions[-1].detail["objects"] == 3
    assert len(stack.objects(item["scratchPrefix"])) == 3
    assert item["grantId"] in stack.grant_ids()


def test_a_grant_already_retired_elsewhere_counts_as_retired(stack: SessionStack) -> None:
    stack.put_session("gone")
    stack.delete("gone")
    runtime = stack.runtime()
    Faults(runtime.clients.kms, "RetireGrant", "NotFoundException", times=1)  # real KMS: the grant no longer exists

    outcome = run_batch(read_lambda_event(stack.lambda_event()), runtime)[-1]

    assert outcome.status is Status.CLEANED
    assert {a.action: a.status for a in outcome.actions}["grant"] is ActionStatus.ALREADY_DONE


def test_a_remove_from_a_keys_only_stream_is_reported_with_the_fix(aws, request, invoke) -> None:
    stack = SessionStack.create(aws, request.node.name, view_type="KEYS_ONLY")
    item = stack.put_session("k")
    stack.delete("k")
    event = stack.lambda_event()
    remove = event["Records"][-1]

    outcome = outcomes_of(stack, event)[-1]

    answer = invoke(event, session_table=stack.table)  # this test's own table, not the fixture's

    assert answer == {"batchItemFailures": [{"itemIdentifier": remove["dynamodb"]["SequenceNumber"]}]}
    assert outcome.permanent
    assert "NEW_AND_OLD_IMAGES" in (outcome.error or "")
    assert len(stack.objects(item["scratchPrefix"])) == 3  # nothing to clean it from, and nothing was touched


@pytest.mark.parametrize(
    "live_prefix",
    [
        "s3://{bucket}/sessions/t1/same/",  # the same place, spelled as a URI
        "sessions/t1/same/inner/",  # inside the deleted session's prefix
        "sessions/t1/",  # around it
    ],
)
def test_a_reconnected_session_whose_scratch_overlaps_keeps_it(stack: SessionStack, live_prefix: str) -> None:
    old = stack.put_session("same", objects=2)
    stack.delete("same")
    live_prefix = live_prefix.format(bucket=stack.bucket)
    stack.s3.put_object(Bucket=stack.bucket, Key="sessions/t1/same/inner/live", Body=b"live")
    stack.put_item({**old, "grantId": "other-grant", "scratchPrefix": live_prefix})
    event = stack.lambda_event()

    remove = next(o for o in outcomes_of(stack, event) if o.event_name == "REMOVE")

    assert {a.action: a.status for a in remove.actions}["scratch"] is ActionStatus.KEPT
    assert len(stack.objects(old["scratchPrefix"])) == 3
    assert old["grantId"] not in stack.grant_ids()


def test_a_dry_run_sends_nothing_to_the_dead_letter_queue(stack: SessionStack, invoke) -> None:
    sqs = boto3.client("sqs", region_name="us-east-1")
    queue = sqs.create_queue(QueueName=f"dlq-dry-{stack.table}")["QueueUrl"]
    stack.put_session("poison", objects=0, extra={"scratchPrefix": "sessions/../etc/"})
    stack.delete("poison")
    event = stack.lambda_event()

    answer = invoke(event, dead_letter_queue_url=queue, cleanup_mode="dry-run")

    assert answer == {"batchItemFailures": [{"itemIdentifier": event["Records"][-1]["dynamodb"]["SequenceNumber"]}]}
    assert sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get("Messages", []) == []
