"""Keys that cannot travel in DeleteObjects' XML body are deleted one at a time; the rest of the page goes together.

What this relies on in moto 5.2.5 (see ../shared/notes/moto.md): ListObjectsV2 honours ``EncodingType=url``, so keys
with control characters come back exactly; a DeleteObjects whose body carries ``\\x01`` answers 500 for the whole
page (real S3 refuses the XML too), and one carrying ``\\r`` has it read as ``\\n`` by the XML parser (as on real S3).
moto's ListObjectVersions ignores ``EncodingType=url``, which real S3 honours: in a versioned moto bucket a key with
``\\x01`` cannot be listed at all and ``\\r`` comes back as ``\\n``, so the versioned test uses a tab, which moto
lists exactly and which the worker also sends one at a time.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from cleanup.actions.scratch import xml_safe
from cleanup.queues.reporting import run_batch
from schemas.outcomes import Status
from schemas.records import read_lambda_event
from tests.stack import SessionStack

PREFIX = "sessions/t1/odd/"


class S3Calls:
    """Counts the operations a client sends."""

    def __init__(self, s3: Any) -> None:
        self.operations: Counter[str] = Counter()
        s3.meta.events.register("before-call.s3", self._count)

    def _count(self, model: Any, **_: Any) -> None:
        self.operations[model.name] += 1


def clean_odd_session(stack: SessionStack, keys: list[str]) -> tuple[Any, S3Calls]:
    for key in keys:
        stack.s3.put_object(Bucket=stack.bucket, Key=key, Body=b"scratch")
    stack.put_item({"pk": "session#odd", "sk": "meta", "tenantId": "t1", "scratchPrefix": PREFIX})
    stack.delete("odd")
    runtime = stack.runtime()
    calls = S3Calls(runtime.clients.s3)
    return run_batch(read_lambda_event(stack.lambda_event()), runtime)[-1], calls


def test_keys_with_control_characters_are_deleted_one_at_a_time_and_the_rest_together(stack: SessionStack) -> None:
    odd = [f"{PREFIX}start\x01of-heading", f"{PREFIX}carriage\rreturn", f"{PREFIX}tab\there"]
    plain = [f"{PREFIX}plain-{n}" for n in range(5)]
    near = [f"{PREFIX[:-1]}x/start\x01of-heading", "sessions/t1/odd\rx"]  # outside the prefix: must stay
    for key in near:
        stack.s3.put_object(Bucket=stack.bucket, Key=key, Body=b"keep")

    outcome, calls = clean_odd_session(stack, odd + plain)

    assert outcome.status is Status.CLEANED
    assert stack.objects(PREFIX) == []
    assert sorted(stack.objects("sessions/")) == sorted(near)
    assert calls.operations["DeleteObjects"] == 1  # the five plain keys, in one call
    assert calls.operations["DeleteObject"] == len(odd)


def test_in_a_versioned_bucket_every_version_of_such_a_key_is_deleted_by_its_version(aws, request) -> None:
    stack = SessionStack.create(aws, request.node.name, versioned=True)
    odd, plain = f"{PREFIX}tab\there", f"{PREFIX}plain"
    for key in (odd, plain, odd):  # two versions of the odd key
        stack.s3.put_object(Bucket=stack.bucket, Key=key, Body=b"scratch")
    stack.s3.delete_object(Bucket=stack.bucket, Key=odd)  # and a delete marker

    outcome, calls = clean_odd_session(stack, [])

    assert outcome.status is Status.CLEANED
    assert stack.versions(PREFIX) == 0
    assert calls.operations["DeleteObject"] == 3  # two versions and the marker, each by its VersionId
    assert calls.operations["DeleteObjects"] == 1


@pytest.mark.parametrize(
    ("key", "safe"),
    [
        ("sessions/t1/a b/é/𝄞", True),
        ("sessions/t1/a\x7fb", True),
        ("sessions/t1/a\x01b", False),
        ("sessions/t1/a\rb", False),
        ("sessions/t1/a\nb", False),
        ("sessions/t1/a\tb", False),
        ("sessions/t1/a\ufffeb", False),
    ],
)
def test_which_keys_travel_in_the_xml_body(key: str, safe: bool) -> None:
    assert xml_safe(key) is safe
