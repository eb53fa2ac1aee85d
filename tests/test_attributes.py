"""AttributeValue decoding: equal to boto3 on valid input, strict on invalid input."""

from __future__ import annotations

import base64
from decimal import Decimal
from typing import Any

import pytest
from boto3.dynamodb.types import TypeDeserializer
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.attributes import AttributeDecodeError, decode_image, decode_value

BOTO3 = TypeDeserializer()

numbers = (
    st.decimals(allow_nan=False, allow_infinity=False, places=None)
    .filter(lambda d: d == 0 or (len(d.as_tuple().digits) <= 38 and -120 <= d.adjusted() <= 120))
    .map(str)
)
blobs = st.binary(max_size=24)
texts = st.text(max_size=12)

scalars = st.one_of(
    texts.map(lambda s: {"S": s}),
    numbers.map(lambda n: {"N": n}),
    blobs.map(lambda b: {"B": base64.b64encode(b).decode()}),
    st.booleans().map(lambda b: {"BOOL": b}),
    st.just({"NULL": True}),
    st.sets(texts, min_size=1, max_size=4).map(lambda s: {"SS": sorted(s)}),
    st.sets(st.integers(-(10**30), 10**30), min_size=1, max_size=4).map(lambda s: {"NS": [str(n) for n in s]}),
    st.sets(blobs, min_size=1, max_size=4).map(lambda s: {"BS": [base64.b64encode(b).decode() for b in s]}),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda items: {"L": items}),
        st.dictionaries(st.text(min_size=1, max_size=8), inner, max_size=4).map(lambda m: {"M": m}),
    ),
    max_leaves=12,
)


def as_boto3_input(value: dict[str, Any]) -> dict[str, Any]:
    """boto3's deserializer takes what its client hands out: binary already decoded to bytes."""
    ((tag, inner),) = value.items()
    if tag == "B":
        return {"B": base64.b64decode(inner)}
    if tag == "BS":
        return {"BS": [base64.b64decode(b) for b in inner]}
    if tag == "L":
        return {"L": [as_boto3_input(v) for v in inner]}
    if tag == "M":
        return {"M": {k: as_boto3_input(v) for k, v in inner.items()}}
    return value


@settings(max_examples=400, deadline=None)
@given(values)
def test_decoding_equals_boto3_type_deserializer(value: dict[str, Any]) -> None:
    assert decode_value(value) == BOTO3.deserialize(as_boto3_input(value))


def test_every_type_decodes_to_its_python_value() -> None:
    image = {
        "s": {"S": "text"},
        "n": {"N": "123.4500"},
        "b": {"B": base64.b64encode(b"\x00\xff").decode()},
        "ss": {"SS": ["a", "b"]},
        "ns": {"NS": ["1", "2.5"]},
        "bs": {"BS": [base64.b64encode(b"x").decode()]},
        "bool": {"BOOL": False},
        "null": {"NULL": True},
        "m": {"M": {"inner": {"N": "1"}}},
        "l": {"L": [{"S": "a"}, {"N": "2"}]},
    }
    assert decode_image(image) == {
        "s": "text",
        "n": Decimal("123.4500"),
        "b": b"\x00\xff",
        "ss": {"a", "b"},
        "ns": {Decimal("1"), Decimal("2.5")},
        "bs": {b"x"},
        "bool": False,
        "null": None,
        "m": {"inner": Decimal("1")},
        "l": ["a", Decimal("2")],
    }


def test_numbers_are_exact_decimals_never_floats() -> None:
    value = decode_value({"N": "0.1000000000000000000000000000000000001"})
    assert isinstance(value, Decimal)
    assert value == Decimal("0.1000000000000000000000000000000000001")


def test_a_38_digit_number_keeps_every_digit() -> None:
    digits = "12345678901234567890123456789012345678"
    assert decode_value({"N": digits}) == Decimal(digits)


def test_trailing_zeros_of_a_large_integer_are_not_significant() -> None:
    assert decode_value({"N": "1" + "0" * 40}) == Decimal("1E+40")


@pytest.mark.parametrize(
    "value",
    [
        "not-a-number",
        "NaN",
        "Infinity",
        "-inf",
        "1_000",
        " 1",
        "",
        "1" * 39,
        "1E+126",
        "1E-131",
    ],
)
def test_numbers_boto3_would_accept_or_dynamodb_could_not_store_are_refused(value: str) -> None:
    with pytest.raises(AttributeDecodeError, match=r"attribute OldImage\.count"):
        decode_image({"count": {"N": value}}, "OldImage")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"B": "***"}, "not valid base64"),
        ({"X": "1"}, "unknown attribute type 'X'"),
        ({"S": "a", "N": "1"}, "exactly one type tag"),
        ({"SS": []}, "non-empty"),
        ({"SS": ["a", "a"]}, "duplicate"),
        ({"NULL": False}, "NULL value must be true"),
        ({"BOOL": "true"}, "BOOL value"),
        ({"S": 5}, "not a string"),
        ({"L": {"S": "a"}}, "not a list"),
        ({"M": []}, "not an object"),
        ("plain", "exactly one type tag"),
    ],
)
def test_malformed_values_fail_with_a_message_naming_the_attribute(value: Any, message: str) -> None:
    with pytest.raises(AttributeDecodeError, match=r"OldImage\.field") as caught:
        decode_image({"field": value}, "OldImage")
    assert message in str(caught.value)


def test_the_path_of_a_nested_bad_value_is_named() -> None:
    image = {"meta": {"M": {"tags": {"L": [{"S": "ok"}, {"S": "ok"}, {"N": "NaN"}]}}}}
    with pytest.raises(AttributeDecodeError) as caught:
        decode_image(image, "OldImage")
    assert caught.value.path == "OldImage.meta.tags[2]"
