"""Dead-letter records stored in S3 (the claim-check pattern), read back and deleted by redrive.

``cleanup.deadletter`` stores a record too large for one message as an object under DEAD_LETTER_PREFIX in
DEAD_LETTER_BUCKET and sends a message naming it. Here the object is read back and, once its record is clean,
deleted. The location comes from a message, so it is checked first: only that bucket, only under that prefix, only a
key of the shape the worker makes. Only redrive imports this module (the Lambda function's role may write these
objects, never read or delete them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cleanup.aws.calls import call, call_or_gone
from cleanup.deadletter import MESSAGE_FORMAT, is_object_key
from cleanup.exceptions import PermanentError
from cleanup.runtime import Runtime

if TYPE_CHECKING:
    from mypy_boto3_s3.type_defs import DeleteObjectRequestTypeDef, GetObjectRequestTypeDef

MISSING_OBJECT_CODES = frozenset({"NoSuchKey", "NoSuchVersion", "404"})
MAX_STORED_BYTES = 16 * 1024 * 1024  # a stored message is a few MiB at most (a 400 KB item, escaped, and its error)


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A dead-letter message whose record is in an S3 object (``recordObject``), as the message names it."""

    bucket: str
    key: str
    version_id: str | None
    sequence_number: str | None

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def read_stored(runtime: Runtime, stored: StoredRecord) -> dict[str, Any]:
    """The whole dead-letter message (with its record) a message's object holds.

    Raises:
        PermanentError: the message names an object outside DEAD_LETTER_BUCKET / DEAD_LETTER_PREFIX, the object is
            missing, or it is not the dead-letter message of that record.
        TransientError: S3 could not be read now.
    """
    _check_location(runtime, stored)
    s3 = runtime.clients.s3
    where: GetObjectRequestTypeDef = {"Bucket": stored.bucket, "Key": stored.key}
    if stored.version_id:
        where["VersionId"] = stored.version_id
    answer = call_or_gone(s3.get_object, "GetObject", None, MISSING_OBJECT_CODES, **where)
    if answer is None:
        raise PermanentError(f"the record's object {stored} is missing")
    if int(answer.get("ContentLength") or 0) > MAX_STORED_BYTES:
        raise PermanentError(f"the record's object {stored} is larger than {MAX_STORED_BYTES} bytes")
    data = call(answer["Body"].read, "GetObject", None)  # the body streams: reading it may fail too
    try:
        message = json.loads(data)
    except ValueError as exc:
        raise PermanentError(f"the record's object {stored} is not JSON: {exc}") from exc
    if not isinstance(message, dict) or message.get("format") != MESSAGE_FORMAT or "record" not in message:
        raise PermanentError(f"the record's object {stored} is not a dead-letter message")
    if stored.sequence_number is not None and message.get("sequenceNumber") != stored.sequence_number:
        raise PermanentError(f"the record's object {stored} holds another record")
    return message


def delete_stored(runtime: Runtime, stored: StoredRecord) -> None:
    """Delete a stored record's object (its very version, in a versioned bucket). Already gone counts as deleted.

    Raises:
        TransientError / PermanentError: the object could not be deleted.
    """
    _check_location(runtime, stored)
    where: DeleteObjectRequestTypeDef = {"Bucket": stored.bucket, "Key": stored.key}
    if stored.version_id:
        where["VersionId"] = stored.version_id
    call(runtime.clients.s3.delete_object, "DeleteObject", None, **where)


def _check_location(runtime: Runtime, stored: StoredRecord) -> None:
    # The location comes from a message: read and delete only what the worker itself stores, where it stores it.
    settings = runtime.settings
    bucket, prefix = settings.dead_letter_store, settings.dead_letter_prefix
    if stored.bucket != bucket or not is_object_key(stored.key, prefix):
        raise PermanentError(
            f"the message names the object {str(stored)[:300]!r}, which is not a dead-letter object of this worker "
            f"(DEAD_LETTER_BUCKET {bucket!r}, DEAD_LETTER_PREFIX {prefix!r}): left alone"
        )
