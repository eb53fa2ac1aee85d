"""Property-based: generated and mutated stream records never raise past the decoder, the classifier or the batch.

Whatever a record holds, reading it gives a record or an unreadable record (a ``RecordError`` only when not even its
sequence number can be read), classifying it decides or raises ``BadRecordError``, and a batch of bad records gives
one failed, permanent outcome per record, by its own sequence number, without a single AWS call.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cleanup.aws.clients import Clients
from cleanup.core.classify import classify
from cleanup.core.pipeline import process_batch
from cleanup.exceptions import BadRecordError
from cleanup.runtime import Runtime
from cleanup.telemetry import Metrics, MetricsSink
from schemas.outcomes import Status
from schemas.records import RecordError, Source, StreamRecord, UnreadableRecord, read_record, sequence_number_of
from schemas.settings import Settings

SETTINGS = Settings(
    scratch_bucket="scratch",
    kms_key_id="arn:aws:kms:us-east-1:123456789012:key/k",
    session_table="sessions",
    race_check=True,
)
SESSION_ATTRIBUTES = ("connectionId", "scratchPrefix", "grantId", "tenantId", "ttl", "kmsKeyId", "callbackUrl")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
numbers = st.integers().map(str) | st.decimals(allow_nan=False, allow_infinity=False).map(str)
valid_attribute = st.recursive(
    st.one_of(
        st.builds(lambda s: {"S": s}, st.text(max_size=8)),
        st.builds(lambda n: {"N": n}, numbers),
        st.builds(lambda b: {"BOOL": b}, st.booleans()),
        st.just({"NULL": True}),
        st.builds(lambda s: {"SS": sorted(s)}, st.sets(st.text(max_size=4), min_size=1, max_size=3)),
        st.builds(lambda b: {"B": b}, st.sampled_from(["", "AA==", "c2Vzc2lvbg=="])),
    ),
    lambda inner: (
        st.builds(lambda v: {"L": v}, st.lists(inner, max_size=3))
        | st.builds(lambda v: {"M": v}, st.dictionaries(st.text(max_size=4), inner, max_size=3))
    ),
    max_leaves=6,
)
bad_attribute = st.one_of(
    st.builds(lambda v: {"N": v}, st.text(max_size=6).filter(lambda t: not t.strip().lstrip("-").isdigit())),
    st.builds(lambda v: {"S": v}, st.integers() | st.none() | st.lists(st.text(), max_size=2)),
    st.builds(lambda t, v: {t: v}, st.text(min_size=1, max_size=3).filter(lambda t: t not in _TAGS), json_values),
    st.sampled_from([{}, {"S": "a", "N": "1"}, {"SS": []}, {"SS": ["a", "a"]}, {"B": "not base64!"}, {"NULL": False}]),
    st.sampled_from([{"N": "1e200"}, {"N": "1" * 40}, {"N": "NaN"}, {"BOOL": "true"}, {"M": []}, {"L": {}}]),
    json_values.filter(lambda v: not isinstance(v, dict)),
)
_TAGS = {"S", "N", "B", "BOOL", "NULL", "M", "L", "SS", "NS", "BS"}


def base_record(sequence: int) -> dict[str, Any]:
    """A well-formed TTL REMOVE of a session, as a Lambda event source mapping delivers it."""
    return {
        "eventID": f"e{sequence}",
        "eventName": "REMOVE",
        "eventSource": "aws:dynamodb",
        "eventSourceARN": "arn:aws:dynamodb:us-east-1:123456789012:table/sessions/stream/2024",
        "userIdentity": {"type": "Service", "principalId": "dynamodb.amazonaws.com"},
        "dynamodb": {
            "ApproximateCreationDateTime": 1_700_000_000,
            "Keys": {"pk": {"S": f"session#{sequence}"}, "sk": {"S": "meta"}},
            "OldImage": {
                "pk": {"S": f"session#{sequence}"},
                "sk": {"S": "meta"},
                "scratchPrefix": {"S": f"sessions/t1/{sequence}/"},
                "grantId": {"S": "g"},
                "tenantId": {"S": "t1"},
                "ttl": {"N": "1699999000"},
            },
            "SequenceNumber": str(1000 + sequence),
            "StreamViewType": "NEW_AND_OLD_IMAGES",
        },
    }


PATHS = [
    (),
    ("dynamodb",),
    ("dynamodb", "Keys"),
    ("dynamodb", "OldImage"),
    ("dynamodb", "NewImage"),
    ("dynamodb", "ApproximateCreationDateTime"),
    ("dynamodb", "SequenceNumber"),
    ("dynamodb", "StreamViewType"),
    ("userIdentity",),
    ("userIdentity", "type"),
    ("userIdentity", "principalId"),
    ("eventName",),
    ("eventID",),
    ("eventSourceARN",),
    ("tableName",),
    ("dynamodb", "OldImage", "scratchPrefix"),
    ("dynamodb", "OldImage", "ttl"),
    ("dynamodb", "Keys", "pk"),
]


@st.composite
def mutated_records(draw: st.DrawFn, sequence: int = 1) -> dict[str, Any]:
    """A session REMOVE with a few of its fields replaced by anything JSON, or removed."""
    record = base_record(sequence)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS[1:]))
        parent: Any = record
        for step in path[:-1]:
            if not isinstance(parent, dict):
                break
            parent = parent.setdefault(step, {})
        if isinstance(parent, dict):
            if draw(st.booleans()):
                parent.pop(path[-1], None)
            else:
                # A copy: st.just and st.sampled_from hand out the same objects every time, and the next mutation
                # could otherwise write into one (or into itself, making a cycle).
                parent[path[-1]] = copy.deepcopy(draw(json_values | valid_attribute | bad_attribute))
    return record


@st.composite
def poisoned_records(draw: st.DrawFn, sequence: int) -> dict[str, Any]:
    """A session REMOVE whose old image holds at least one invalid AttributeValue among valid ones."""
    record = base_record(sequence)
    image = record["dynamodb"]["OldImage"]
    for name in draw(st.lists(st.sampled_from(SESSION_ATTRIBUTES), min_size=0, max_size=3)):
        image[name] = copy.deepcopy(draw(valid_attribute))
    image[draw(st.sampled_from(SESSION_ATTRIBUTES))] = copy.deepcopy(draw(bad_attribute))
    return record


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=mutated_records(), source=st.sampled_from([None, *Source]))
def test_reading_and_classifying_any_record_raises_only_the_records_own_errors(raw: Any, source: Any) -> None:
    try:
        record = read_record(copy.deepcopy(raw), source)
    except RecordError:
        assert sequence_number_of(raw) is None
        return
    if isinstance(record, UnreadableRecord):
        assert record.sequence_number == sequence_number_of(raw)
        assert record.error
        return
    assert isinstance(record, StreamRecord)
    try:
        classify(record, SETTINGS)
    except BadRecordError as exc:
        assert str(exc)


@settings(max_examples=200, deadline=None)
@given(raw=json_values)
def test_anything_at_all_is_read_or_refused_with_a_record_error(raw: Any) -> None:
    try:
        record = read_record(raw)
    except RecordError:
        assert sequence_number_of(raw) is None
        return
    assert record.sequence_number == sequence_number_of(raw)


class NoCalls(Clients):
    """Clients that must not be asked for: a bad record has to fail before any AWS call."""

    asked: list[str]

    def get(self, service: str, endpoint_url: str | None = None) -> Any:
        self.asked.append(service)
        raise AssertionError(f"a bad record reached AWS ({service})")


@pytest.fixture(scope="module")
def no_calls_runtime() -> Any:
    clients = NoCalls(SETTINGS)
    clients.asked = []
    runtime = Runtime(SETTINGS, clients, Metrics(SETTINGS, MetricsSink("off")))
    yield runtime
    runtime.close()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), size=st.integers(1, 8))
def test_a_batch_of_bad_records_reports_each_by_its_sequence_number_without_calling_aws(
    no_calls_runtime: Runtime, data: st.DataObject, size: int
) -> None:
    raws = [data.draw(poisoned_records(sequence)) for sequence in range(size)]
    records = [read_record(raw, Source.LAMBDA) for raw in raws]

    outcomes = process_batch(records, no_calls_runtime)

    assert [o.sequence_number for o in outcomes] == [raw["dynamodb"]["SequenceNumber"] for raw in raws]
    assert all(o.status is Status.FAILED and o.permanent for o in outcomes)
    assert not any((o.error or "").startswith("internal error") for o in outcomes)
    assert no_calls_runtime.clients.asked == []  # type: ignore[attr-defined]


def test_a_user_identity_of_the_wrong_type_is_reported_by_sequence_number_not_raised() -> None:
    raw = base_record(7)
    raw["userIdentity"] = {"type": 5, "principalId": "dynamodb.amazonaws.com"}

    record = read_record(raw, Source.LAMBDA)

    assert isinstance(record, UnreadableRecord)
    assert record.sequence_number == "1007"
    assert "userIdentity" in record.error
