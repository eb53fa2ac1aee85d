"""Decoding speed: this worker's AttributeValue decoder against boto3's TypeDeserializer and Powertools' data class.

The worker decodes only the attributes a session is built from (``decode_image of the attributes read``); the whole
image is decoded too, for the comparison with the others, which decode everything.

All three decode the same records' OldImage, and their results are checked equal before anything is timed. boto3's
deserializer is given binary values already decoded to bytes (as its client hands them out): the base64 step a
Lambda handler would need first is not counted against it. Powertools (v3) leaves binary values as base64 text, so
its results are compared with ours after encoding our bytes back to base64.
"""

from __future__ import annotations

import base64
import copy
import gc
import random
import time
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools.utilities.data_classes import DynamoDBStreamEvent
from boto3.dynamodb.types import TypeDeserializer

from schemas.attributes import decode_image
from schemas.records import Source, parse_record
from schemas.settings import AttributeNames


def mixed_records(count: int, seed: int = 7) -> list[dict[str, Any]]:
    """Lambda-shaped REMOVE records whose OldImage holds every AttributeValue type, nested too."""
    rng = random.Random(seed)
    records = []
    for n in range(count):
        blob = base64.b64encode(rng.randbytes(rng.randint(1, 24))).decode()
        image = {
            "pk": {"S": f"session#{n:06d}"},
            "sk": {"S": "meta"},
            "tenantId": {"S": f"tenant-{n % 13}"},
            "connectionId": {"S": f"Zx{n:012d}="},
            "scratchPrefix": {"S": f"sessions/tenant-{n % 13}/{n:06d}/"},
            "grantId": {"S": f"{n:064x}"},
            "ttl": {"N": str(1_700_000_000 + n)},
            "cost": {"N": f"{rng.randint(0, 10**6)}.{rng.randint(0, 99):02d}"},
            "token": {"B": blob},
            "active": {"BOOL": bool(n % 2)},
            "closedBy": {"NULL": True},
            "scopes": {"SS": sorted({f"scope-{rng.randint(0, 9)}" for _ in range(3)})},
            "ports": {"NS": sorted({str(rng.randint(1, 65535)) for _ in range(3)})},
            "keys": {"BS": [blob, base64.b64encode(f"k{n}".encode()).decode()]},
            "meta": {"M": {"turns": {"N": str(n % 50)}, "model": {"S": "m1"}, "tags": {"L": [{"S": "a"}, {"N": "1"}]}}},
            "history": {"L": [{"M": {"at": {"N": str(n)}, "ok": {"BOOL": True}}}, {"S": "x" * (n % 40)}]},
        }
        change: dict[str, Any] = {"Keys": {"pk": image["pk"], "sk": image["sk"]}, "OldImage": image}
        change |= {"SequenceNumber": f"{n + 1:021d}", "StreamViewType": "NEW_AND_OLD_IMAGES"}
        records.append({"eventID": f"{n:032x}", "eventName": "REMOVE", "dynamodb": change, "eventSourceARN": "arn"})
    return records


def boto3_input(value: Any) -> Any:
    """An AttributeValue with its binary as bytes, the form boto3's deserializer accepts."""
    ((tag, inner),) = value.items()
    if tag == "B":
        return {"B": base64.b64decode(inner)}
    if tag == "BS":
        return {"BS": [base64.b64decode(b) for b in inner]}
    if tag == "L":
        return {"L": [boto3_input(v) for v in inner]}
    if tag == "M":
        return {"M": {k: boto3_input(v) for k, v in inner.items()}}
    return value


def binary_as_base64(value: Any) -> Any:
    """Decoded values with binary turned back into base64 text: Powertools leaves ``B`` and ``BS`` undecoded."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, set | frozenset):
        return {binary_as_base64(item) for item in value}
    if isinstance(value, list):
        return [binary_as_base64(item) for item in value]
    if isinstance(value, dict):
        return {name: binary_as_base64(item) for name, item in value.items()}
    return value


def decoders(records: list[dict[str, Any]]) -> dict[str, Callable[[], list[dict[str, Any]]]]:
    """Each way of decoding every record's OldImage, ready to be timed."""
    images = [record["dynamodb"]["OldImage"] for record in records]
    boto3_images = [{name: boto3_input(value) for name, value in image.items()} for image in images]
    deserializer = TypeDeserializer()

    def ours() -> list[dict[str, Any]]:
        return [decode_image(image, "OldImage") for image in images]

    read = AttributeNames().session

    def ours_read() -> list[dict[str, Any]]:
        return [decode_image(image, "OldImage", read) for image in images]

    def ours_with_record() -> list[dict[str, Any]]:
        return [decode_image(parse_record(raw, Source.LAMBDA).old_image or {}, "OldImage", read) for raw in records]

    def boto3() -> list[dict[str, Any]]:
        return [{name: deserializer.deserialize(value) for name, value in image.items()} for image in boto3_images]

    def powertools() -> list[dict[str, Any]]:
        event = DynamoDBStreamEvent({"Records": records})  # a new event each time: its images are cached properties
        return [record.dynamodb.old_image for record in event.records if record.dynamodb is not None]

    return {
        "schemas.attributes.decode_image": ours,
        "decode_image of the attributes read": ours_read,
        "parse_record + decode_image of the attributes read": ours_with_record,
        "boto3 TypeDeserializer": boto3,
        "Powertools DynamoDBStreamEvent": powertools,
    }


def best_times(ways: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """The best of ``repeat`` timings of each, taken in turns (so a busy moment hurts all of them alike) and, as
    ``timeit`` does, with the garbage collector paused."""
    best = dict.fromkeys(ways, float("inf"))
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeat):
            for name, way in ways.items():
                started = time.perf_counter()
                way()
                best[name] = min(best[name], time.perf_counter() - started)
    finally:
        gc.enable()
    return best


def measure(count: int, repeat: int = 5) -> dict[str, float]:
    """Records per second of each decoder, after checking that all of them decode to the same values."""
    records = mixed_records(count)
    pristine = copy.deepcopy(records)
    ways = decoders(records)
    results = {name: way() for name, way in ways.items()}
    reference = results.pop("schemas.attributes.decode_image")
    read = results.pop("decode_image of the attributes read")
    if results.pop("parse_record + decode_image of the attributes read") != read or read != [
        {name: image[name] for name in AttributeNames().session if name in image} for image in reference
    ]:
        raise AssertionError("decoding the attributes read differs from decoding them all")
    for name, result in results.items():
        expected = binary_as_base64(reference) if name.startswith("Powertools") else reference
        if result != expected:
            raise AssertionError(f"{name} decodes differently from schemas.attributes.decode_image")
    if records != pristine:
        raise AssertionError("a decoder changed its input")
    return {name: count / seconds for name, seconds in best_times(ways, repeat).items()}
