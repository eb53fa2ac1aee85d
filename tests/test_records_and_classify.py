"""The three record shapes, and the classification of a record into clean / skip / fail with a reason."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from cleanup.core.classify import classify
from cleanup.exceptions import BadRecordError
from schemas.outcomes import Reason
from schemas.records import RecordError, Source, UnreadableRecord, parse_record, read_lambda_event, read_record
from schemas.settings import Settings

NOW = 1_800_000_000
ARN = "arn:aws:dynamodb:us-east-1:123456789012:table/sessions/stream/2026-11-29T00:00:00.000"
SETTINGS = Settings(scratch_bucket="scratch", session_table="sessions")


def change(event_name: str = "REMOVE", *, ttl: int = NOW + 600, created: float = NOW, **fields: Any) -> dict[str, Any]:
    old = {
        "pk": {"S": "session#abc"},
        "sk": {"S": "meta"},
        "connectionId": {"S": "c-1="},
        "scratchPrefix": {"S": "sessions/t1/abc/"},
        "grantId": {"S": "g-1"},
        "tenantId": {"S": "t1"},
        "ttl": {"N": str(ttl)},
    }
    record: dict[str, Any] = {
        "eventID": "e-1",
        "eventName": event_name,
        "eventSource": "aws:dynamodb",
        "awsRegion": "us-east-1",
        "dynamodb": {
            "ApproximateCreationDateTime": created,
            "Keys": {"pk": old["pk"], "sk": old["sk"]},
            "OldImage": old,
            "SequenceNumber": "4100000000000000000001",
            "StreamViewType": "NEW_AND_OLD_IMAGES",
        },
    }
    record.update(fields)
    return record


def test_a_lambda_record_names_its_table_through_the_stream_arn() -> None:
    record = parse_record({**change(), "eventSourceARN": ARN})
    assert record.source is Source.LAMBDA
    assert record.table == "sessions"
    assert record.created_at == NOW


def test_a_kinesis_record_has_milliseconds_and_an_outside_sequence_number() -> None:
    raw = change(created=NOW * 1000, tableName="sessions", recordFormat="application/json")
    del raw["dynamodb"]["SequenceNumber"]
    record = parse_record(raw, sequence_number="49590338271490256608559692538361571095921575989136588898")
    assert record.source is Source.KINESIS
    assert record.created_at == NOW
    assert record.table == "sessions"
    assert record.sequence_number.startswith("4959")


def test_a_record_already_parsed_by_boto3_is_accepted() -> None:
    raw = change()
    raw["dynamodb"]["ApproximateCreationDateTime"] = datetime.fromtimestamp(NOW, UTC)
    assert parse_record(raw, Source.STREAMS).created_at == NOW


def test_a_malformed_record_is_reported_by_its_sequence_number() -> None:
    raw = change()
    raw["dynamodb"]["Keys"] = "not-a-map"
    record = read_record(raw)
    assert isinstance(record, UnreadableRecord)
    assert record.sequence_number == "4100000000000000000001"
    assert "dynamodb.Keys" in record.error


def test_a_lambda_event_with_an_unreadable_sequence_number_fails_whole() -> None:
    raw = change()
    del raw["dynamodb"]["SequenceNumber"]
    with pytest.raises(RecordError, match="record 1 of the event"):
        read_lambda_event({"Records": [change(), raw]})


@pytest.mark.parametrize(
    "identity",
    [
        {"type": "Service", "principalId": "dynamodb.amazonaws.com"},
        {"Type": "Service", "PrincipalId": "dynamodb.amazonaws.com"},
    ],
)
def test_a_ttl_delete_is_told_by_its_user_identity_in_either_spelling(identity: dict[str, str]) -> None:
    decision = classify(parse_record(change(ttl=NOW - 90, userIdentity=identity)), SETTINGS)
    assert decision.reason is Reason.TTL
    assert decision.ttl_lag_seconds == 90


def test_a_delete_after_the_ttl_without_identity_is_expired() -> None:
    assert classify(parse_record(change(ttl=NOW - 1)), SETTINGS).reason is Reason.EXPIRED


def test_a_delete_before_the_ttl_is_explicit() -> None:
    assert classify(parse_record(change(ttl=NOW + 1)), SETTINGS).reason is Reason.EXPLICIT


def test_another_service_identity_is_not_ttl() -> None:
    identity = {"type": "Service", "principalId": "other.amazonaws.com"}
    assert classify(parse_record(change(ttl=NOW + 5, userIdentity=identity)), SETTINGS).reason is Reason.EXPLICIT


@pytest.mark.parametrize("event_name", ["INSERT", "MODIFY"])
def test_inserts_and_modifies_are_skipped(event_name: str) -> None:
    decision = classify(parse_record(change(event_name)), SETTINGS)
    assert decision.session is None
    assert event_name in (decision.skip_reason or "")


def test_a_remove_without_old_image_names_the_cause_and_the_fix() -> None:
    raw = change()
    del raw["dynamodb"]["OldImage"]
    raw["dynamodb"]["StreamViewType"] = "KEYS_ONLY"
    with pytest.raises(BadRecordError, match=r"KEYS_ONLY.*NEW_AND_OLD_IMAGES"):
        classify(parse_record(raw), SETTINGS)


def test_an_entity_without_session_attributes_is_not_a_session() -> None:
    raw = change()
    raw["dynamodb"]["OldImage"] = {"pk": {"S": "order#1"}, "sk": {"S": "meta"}, "ttl": {"N": "1"}}
    decision = classify(parse_record(raw), SETTINGS)
    assert decision.session is None
    assert "not a session" in (decision.skip_reason or "")


def test_a_key_outside_the_session_key_prefix_is_not_a_session() -> None:
    decision = classify(parse_record(change()), SETTINGS.model_copy(update={"session_key_prefix": "sess:"}))
    assert decision.session is None


def test_a_malformed_image_value_fails_naming_the_attribute() -> None:
    raw = change()
    raw["dynamodb"]["OldImage"]["ttl"] = {"N": "not-a-number"}
    with pytest.raises(BadRecordError, match=r"OldImage\.ttl"):
        classify(parse_record(raw), SETTINGS)


def test_only_the_attributes_a_session_is_built_from_are_decoded() -> None:
    raw = change()
    raw["dynamodb"]["OldImage"]["history"] = {"N": "NaN"}  # the application's own: the worker never reads it
    decision = classify(parse_record(raw), SETTINGS)
    assert decision.session is not None
    assert decision.session.grant_id == raw["dynamodb"]["OldImage"]["grantId"]["S"]


def test_a_session_attribute_of_the_wrong_type_fails_naming_it() -> None:
    raw = change()
    raw["dynamodb"]["OldImage"]["grantId"] = {"N": "5"}
    with pytest.raises(BadRecordError, match="grantId"):
        classify(parse_record(raw), SETTINGS)


def test_attribute_names_are_configurable() -> None:
    raw = change()
    old = raw["dynamodb"]["OldImage"]
    old["socket"] = old.pop("connectionId")
    settings = Settings(scratch_bucket="scratch", session_table="sessions", attributes={"connection_id": "socket"})
    decision = classify(parse_record(raw), settings)
    assert decision.session is not None
    assert decision.session.connection_id == "c-1="


def test_binary_keys_round_trip_through_json() -> None:
    raw = change()
    raw["dynamodb"]["Keys"] = {"pk": {"B": base64.b64encode(b"\x01\x02").decode()}}
    record = parse_record(json.loads(json.dumps(raw)))
    assert record.keys["pk"]["B"] == "AQI="


def test_an_item_of_the_registry_table_is_never_a_session_whatever_stream_brings_it() -> None:
    registry_arn = ARN.replace("table/sessions/", "table/rooms/")
    record = parse_record({**change(), "eventSourceARN": registry_arn})

    decision = classify(record, Settings(scratch_bucket="scratch", registry_table="rooms"))

    assert decision.session is None and "registry table 'rooms'" in (decision.skip_reason or "")
    alone = Settings(scratch_bucket="scratch", session_table="rooms")
    assert classify(record, alone).session is not None  # without a registry setting: a table like any other


@pytest.mark.parametrize(
    ("fields", "settings", "error"),
    [
        ({}, Settings(scratch_bucket="scratch", session_table="sessions"), "names no table"),
        ({"tableName": "sessions"}, Settings(scratch_bucket="scratch"), "SESSION_TABLE is not set"),
    ],
    ids=["no table named", "no SESSION_TABLE"],
)
def test_a_kinesis_record_whose_table_cannot_be_told_fails_permanently(
    fields: dict[str, Any], settings: Settings, error: str
) -> None:
    record = read_record(change(created=NOW * 1000, **fields), Source.KINESIS, sequence_number="49650001")

    with pytest.raises(BadRecordError, match=error):
        classify(record, settings)


@pytest.mark.parametrize(
    ("keys", "error"),
    [
        ({"pk": {"S": "session#gone"}, "sk": {"S": "meta"}}, "differ on pk"),
        ({}, "no Keys"),
    ],
    ids=["keys of another item", "no keys"],
)
def test_a_record_whose_keys_are_not_its_old_images_fails_and_frees_nothing(keys: dict[str, Any], error: str) -> None:
    # The race check reads under Keys; a hand-made record naming a key that no longer exists, with a live session's
    # attributes in OldImage, would otherwise free that live session's resources.
    raw = change()
    raw["dynamodb"]["Keys"] = keys

    with pytest.raises(BadRecordError, match=error):
        classify(parse_record(raw), SETTINGS)


def test_a_dynamodb_record_of_another_table_is_skipped() -> None:
    record = parse_record({**change(), "eventSourceARN": ARN.replace("table/sessions/", "table/orders/")})

    decision = classify(record, SETTINGS)

    assert decision.session is None
    assert decision.skip_reason == "not a session: an item of table 'orders', not of SESSION_TABLE 'sessions'"


@pytest.mark.parametrize("fields", [{"eventSourceARN": ARN}, {}], ids=["named by its stream", "no table named"])
def test_without_session_table_no_dynamodb_record_is_trusted(fields: dict[str, Any]) -> None:
    record = parse_record({**change(), **fields})

    with pytest.raises(BadRecordError, match="SESSION_TABLE is not set"):
        classify(record, Settings(scratch_bucket="scratch"))


def test_a_dynamodb_record_naming_no_table_is_taken_as_session_tables() -> None:
    # A GetRecords response names no table; the race check then reads SESSION_TABLE under the record's keys.
    decision = classify(parse_record(change(), Source.STREAMS), SETTINGS)

    assert decision.session is not None and decision.session.grant_id == "g-1"
