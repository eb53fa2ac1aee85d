"""Hypothesis strategies for hostile messages: any JSON, or a good message with one field turned into any JSON."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
)
object_locations = st.fixed_dictionaries(
    {"bucket": json_values, "key": json_values}, optional={"versionId": json_values}
)
FIELDS = (
    "format",
    "remaining",
    "record",
    "recordObject",
    "sequenceNumber",
    "source",
    "integrity",
    "DDBStreamBatchInfo",
)


def bodies(good: str) -> st.SearchStrategy[str]:
    """Any JSON body, or ``good`` with one field (or a field of its record) replaced by any JSON value."""

    def replaced(field: str, value: Any) -> str:
        return json.dumps({**json.loads(good), field: value})

    def in_record(field: str, value: Any) -> str:
        message = json.loads(good)
        if isinstance(message.get("record"), dict):
            message["record"][field] = value
        return json.dumps(message)

    fields = st.sampled_from(FIELDS)
    return st.one_of(
        json_values.map(json.dumps),
        st.builds(replaced, fields, json_values),
        st.builds(replaced, st.just("remaining"), st.lists(json_values, min_size=1, max_size=3)),
        st.builds(replaced, st.just("recordObject"), object_locations),
        st.builds(in_record, st.sampled_from(("dynamodb", "eventSourceARN", "eventName")), json_values),
    )
