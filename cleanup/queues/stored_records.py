"""A dead-letter record too large for a message (the claim-check pattern): the key of the S3 object that holds it,
and the message that names the object in its place.

A message may be as large as the queue's MaximumMessageSize; escaping can triple an item's 400 KB. The object, under
DEAD_LETTER_PREFIX in DEAD_LETTER_BUCKET, holds the whole message; the message sent carries ``recordObject``
(bucket, key, version) in place of the record, with every other field and ``recordDigest``;
``cleanup.queues.claim_check`` reads it back.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import TYPE_CHECKING, Any

from cleanup.aws.calls import call
from cleanup.deadline import Deadline
from cleanup.queues.integrity import DIGEST_FIELD

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

SHORT_ERROR = 1_000  # characters of the error a message keeps when its whole error is in the object
OBJECT_KEY = r"[0-9]{4}/[0-9]{2}/[0-9]{2}/(?:[0-9]{1,64}|unknown)-[0-9a-f]{32}\.json"
_SEQUENCE_NUMBER = re.compile(r"[0-9]{1,64}")


def message_size(body: str) -> int:
    """What SQS counts: the body's UTF-8 bytes (the same as its length, since bodies are ASCII JSON)."""
    return len(body.encode("utf-8"))


def object_key(prefix: str, sequence_number: str, now: float | None = None) -> str:
    """A new object's key: the prefix, the day, the sequence number (when it is digits) and a random id.

    Nothing a record supplies goes into a key as it is: a sequence number that is not all digits is left out.
    """
    day = time.strftime("%Y/%m/%d", time.gmtime(time.time() if now is None else now))
    number = sequence_number if _SEQUENCE_NUMBER.fullmatch(sequence_number) else "unknown"
    return f"{prefix}{day}/{number}-{uuid.uuid4().hex}.json"


def is_object_key(key: str, prefix: str) -> bool:
    """Whether ``key`` is one ``object_key`` makes under ``prefix`` (a message's location is checked with it)."""
    return re.fullmatch(re.escape(prefix) + OBJECT_KEY, key) is not None


def pointer_body(message: dict[str, Any], location: dict[str, str], limit: int, record_digest: str) -> str | None:
    """The message naming the stored record: every field but the record, ``recordObject`` and ``recordDigest`` (the
    digest of the object's bytes, which the message's integrity tag then covers).

    When that is still over ``limit`` (an error quoting a huge item attribute), the error is shortened and the actions
    cut to their names and statuses, with ``truncated``: both are whole in the object. None if even that is too large.
    """
    pointer = {name: value for name, value in message.items() if name != "record"}
    pointer["recordObject"] = location
    pointer[DIGEST_FIELD] = record_digest
    body = json.dumps(pointer, default=str)
    if message_size(body) <= limit:
        return body
    error = pointer.get("error")
    if isinstance(error, str) and len(error) > SHORT_ERROR:
        pointer["error"] = error[:SHORT_ERROR] + "..."
    pointer["actions"] = [
        {name: action.get(name) for name in ("action", "status", "permanent")}
        for action in pointer.get("actions") or []
        if isinstance(action, dict)
    ]
    pointer["truncated"] = True
    body = json.dumps(pointer, default=str)
    return body if message_size(body) <= limit else None


def put_record(s3: S3Client, bucket: str, key: str, body: str, deadline: Deadline) -> dict[str, str]:
    data = body.encode("utf-8")
    answer = call(
        s3.put_object, "PutObject", deadline, Bucket=bucket, Key=key, Body=data, ContentType="application/json"
    )
    location = {"bucket": bucket, "key": key}
    if answer.get("VersionId") and answer["VersionId"] != "null":
        location["versionId"] = str(answer["VersionId"])  # a versioned bucket: redrive deletes this very version
    return location
