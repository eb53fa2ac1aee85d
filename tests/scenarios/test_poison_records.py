"""Scenario 4: poison records among good ones go to the dead-letter queue with their error; the shard goes on."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from tests.scenarios.helpers import World, assert_final_state, new_ids, sequence_number
from tests.stack import client

pytestmark = pytest.mark.slow  # a fault scenario


def crafted(template: dict[str, Any], number: str, pk: str, old_image: Any, **change: Any) -> dict[str, Any]:
    """A REMOVE record of its own item (so it blocks no good record of the same key), with a poisoned image."""
    record = copy.deepcopy(template)
    record["dynamodb"].update(
        {"SequenceNumber": number, "Keys": {"pk": {"S": pk}, "sk": {"S": "meta"}}, "OldImage": old_image, **change}
    )
    return record


def drain(sqs: Any, queue_url: str) -> list[dict[str, Any]]:
    bodies: list[dict[str, Any]] = []
    while messages := sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", []):
        bodies += [json.loads(message["Body"]) for message in messages]
    return bodies


@pytest.mark.timeout(60)
def test_poison_records_are_dead_lettered_with_their_error_and_the_good_ones_cleaned(world: World) -> None:
    stack = world.stack
    sqs = client("sqs")
    queue_url = sqs.create_queue(QueueName=f"dlq-{stack.bucket}")["QueueUrl"]
    key = {"kmsKeyId": stack.key_arn}  # the runtime has no KMS_KEY_ID: each good item names its (allowed) key
    live = world.make_sessions(new_ids(5, "live"), sockets=1, **key)
    ended = world.make_sessions(new_ids(30, "end"), sockets=5, **key)
    kept = world.plant_sentinels()
    stack.put_item(
        {"pk": "session#escape", "sk": "meta", "tenantId": "t1", "scratchPrefix": "sessions/t1/../../other/t1/x/"}
    )
    no_key = world.make_sessions(new_ids(1, "nokey"), objects=0)[0]  # a grant, and no key to retire it with
    poisoned_prefixes = [f"sessions/t1/{sid}/" for sid in new_ids(5, "poison")]
    for prefix in poisoned_prefixes:
        stack.s3.put_object(Bucket=stack.bucket, Key=f"{prefix}part-0", Body=b"keep")
    world.end(ended)
    stack.delete("escape")
    stack.delete(no_key.id)
    records = world.records()
    template = records[-1]
    base = sequence_number(template)

    def image(prefix: str, **bad: Any) -> dict[str, Any]:
        return {"pk": {"S": "x"}, "scratchPrefix": {"S": prefix}, "tenantId": {"S": "t1"}, **bad}

    poison = [
        crafted(template, f"{base}1", "session#p1", image(poisoned_prefixes[0], ttl={"N": "soon"})),
        crafted(template, f"{base}2", "session#p2", image(poisoned_prefixes[1], scratchPrefix={"S": 42})),
        crafted(template, f"{base}3", "session#p3", image(poisoned_prefixes[2], grantId={"X": "abc"})),
        crafted(template, f"{base}4", "session#p4", image(poisoned_prefixes[3], connectionId={"SS": []})),
        crafted(template, f"{base}5", "session#p5", image(poisoned_prefixes[4]), Keys="not an object"),
    ]
    event = {"Records": [*records[:10], *poison[:3], *records[10:], *poison[3:]]}
    runtime = world.runtime(kms_key_id=None, allowed_kms_key_ids=stack.key_arn, dead_letter_queue_url=queue_url)
    invoke = world.invoker(runtime)

    assert invoke(event) == {"batchItemFailures": []}

    letters = {letter["sequenceNumber"]: letter for letter in drain(sqs, queue_url)}
    removes = {sequence_number(r): r for r in records if r["eventName"] == "REMOVE"}
    escape = next(n for n, r in removes.items() if r["dynamodb"]["Keys"]["pk"]["S"] == "session#escape")
    nokey = next(n for n, r in removes.items() if r["dynamodb"]["Keys"]["pk"]["S"] == f"session#{no_key.id}")
    assert set(letters) == {escape, nokey, *(sequence_number(r) for r in poison)}
    assert "not strictly under" in letters[escape]["error"] or "segment" in letters[escape]["error"]
    assert "KMS_KEY_ID" in letters[nokey]["error"]
    assert "OldImage.ttl" in letters[f"{base}1"]["error"]
    assert "OldImage.scratchPrefix" in letters[f"{base}2"]["error"]
    assert "unknown attribute type 'X'" in letters[f"{base}3"]["error"]
    assert "OldImage.connectionId" in letters[f"{base}4"]["error"]
    assert "Keys" in letters[f"{base}5"]["error"]
    assert all(letters[n]["record"] == r for n, r in ((sequence_number(r), r) for r in poison))
    untouched = {f"{prefix}part-0" for prefix in poisoned_prefixes}
    assert_final_state(world, deleted=ended, live=[*live, no_key], kept=kept | untouched)
