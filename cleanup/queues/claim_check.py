"""Dead-letter records stored in S3 (the claim-check pattern), read back and deleted by redrive.

``cleanup.queues.deadletter`` stores a record too large for one message as an object under DEAD_LETTER_PREFIX in
DEAD_LETTER_BUCKET and sends a message naming it. Here the object is read back and, once its record is clean,
deleted. The location comes from a message, so it is checked first: only that bucket, only under that prefix, only a
key of the shape the worker makes. Redrive and the backlog's drain (``cleanup.queues.backlog_drain``) use it.

A record may be named by more than one message: a SendMessageBatch whose answer was lost is sent again. So before
the object of a clean record is deleted, a small marker is written beside it, ``<prefix>redriven/<rest of the key>``:
a later message that finds the object missing and the marker there is a duplicate, and goes. An object missing with
no marker was lost some other way (deleted by hand, a lifecycle rule shorter than the queue's retention): its message
is saved under ``<prefix>lost/<rest of the key>`` and reported once, and a duplicate of it then goes too. Markers are
a few bytes, written only for the few records too large for a message, and need no table: S3 is strongly
consistent, and the prefix's lifecycle rule (15 days, past the queues' 14-day retention) removes them once no message
can name their record any more. The marker keys never have the shape of a stored record's key, so no message can
name one as a record.

An object's bytes are checked against the digest its message names (``recordDigest``, covered by the message's
integrity tag: ``cleanup.queues.integrity``) before anything in it is trusted: an object overwritten after the worker
wrote it is refused, and left where it is.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from cleanup.aws.answers import needed
from cleanup.aws.calls import call, call_or_gone
from cleanup.aws.permits import Own, authorized
from cleanup.exceptions import PermanentError
from cleanup.queues.deadletter import MESSAGE_FORMAT, is_object_key
from cleanup.queues.integrity import check_digest
from cleanup.runtime import Runtime

if TYPE_CHECKING:
    from mypy_boto3_s3.type_defs import DeleteObjectRequestTypeDef, GetObjectRequestTypeDef

MISSING_OBJECT_CODES = frozenset({"NoSuchKey", "NoSuchVersion", "404"})
MARKER_FORMAT = "session-cleanup.dead-letter-marker.v1"
JSON = "application/json"
MAX_STORED_BYTES = 16 * 1024 * 1024  # a stored message is a few MiB at most (a 400 KB item, escaped, and its error)


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A dead-letter message whose record is in an S3 object (``recordObject``), as the message names it."""

    bucket: str
    key: str
    version_id: str | None
    sequence_number: str | None
    message: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The message naming the object, as received (saved when the object turns out to be lost)."""
    digest: object = field(default=None, compare=False, repr=False)
    """``recordDigest``: the digest of the object's bytes, as the message's (verified) integrity tag covers it."""

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


class Settled(StrEnum):
    """What became of a stored record whose object is gone, as its marker says."""

    REDRIVEN = "redriven"  # cleaned by an earlier message: this one is a duplicate
    LOST = "lost"  # gone without being redriven, and already reported


def read_stored(runtime: Runtime, stored: StoredRecord) -> dict[str, Any] | None:
    """The whole dead-letter message (with its record) a message's object holds; None when the object is missing.

    Raises:
        IntegrityError: the object's bytes are not those its message's digest names (changed since it was written).
        PermanentError: the message names an object outside DEAD_LETTER_BUCKET / DEAD_LETTER_PREFIX, or the object is
            not the dead-letter message of that record.
        TransientError: S3 could not be read now.
    """
    _check_location(runtime, stored)
    s3 = runtime.clients.s3
    where: GetObjectRequestTypeDef = {"Bucket": stored.bucket, "Key": stored.key}
    if stored.version_id:
        where["VersionId"] = stored.version_id
    answer = call_or_gone(s3.get_object, "GetObject", None, MISSING_OBJECT_CODES, **where)
    if answer is None:
        return None
    if int(answer.get("ContentLength") or 0) > MAX_STORED_BYTES:
        raise PermanentError(f"the record's object {stored} is larger than {MAX_STORED_BYTES} bytes")
    data = call(
        needed(answer, "GetObject", "Body").read, "GetObject", None
    )  # the body streams: reading it may fail too
    check_digest(data, stored.digest, "object")
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
    """Mark a stored record redriven, then delete its object (its very version, in a versioned bucket).

    The marker goes first: whoever finds the object gone then also finds the marker. Already gone counts as deleted.

    Raises:
        TransientError / PermanentError: the marker could not be written or the object deleted (the message stays).
    """
    _check_location(runtime, stored)
    _put_marker(runtime, stored, Settled.REDRIVEN, {"sequenceNumber": stored.sequence_number})
    where: DeleteObjectRequestTypeDef = {"Bucket": stored.bucket, "Key": stored.key}
    if stored.version_id:
        where["VersionId"] = stored.version_id
    # The worker's own object, where it stores them (checked above): no session's, so no fence read is its permit.
    with authorized(Own("stored-record", frozenset({f"s3:{stored.bucket}/{stored.key}"}))):
        call(runtime.clients.s3.delete_object, "DeleteObject", None, **where)


def settled(runtime: Runtime, stored: StoredRecord) -> Settled | None:
    """What the markers say of a stored record whose object is missing (None: nothing, it was lost unseen).

    Raises:
        TransientError / PermanentError: S3 could not be read now.
    """
    _check_location(runtime, stored)
    s3 = runtime.clients.s3
    for state in Settled:
        key = marker_key(runtime, stored, state)
        if call_or_gone(s3.head_object, "HeadObject", None, MISSING_OBJECT_CODES, Bucket=stored.bucket, Key=key):
            return state
    return None


def report_lost(runtime: Runtime, stored: StoredRecord) -> str:
    """Save the message of a record whose object is lost beside where it was; returns the key it is saved under.

    Raises:
        TransientError / PermanentError: it could not be saved (the message must then stay).
    """
    _check_location(runtime, stored)
    return _put_marker(runtime, stored, Settled.LOST, {"object": str(stored), "message": stored.message})


def lost_advice(stored: StoredRecord, report: str, *, saved: bool) -> str:
    """What the operator is told, once, of a record lost unseen: where its message is, and what to do."""
    return (
        f"the record's object {stored} is missing and was never redriven: the record cannot be cleaned from it. "
        f"The message is {'saved as' if saved else 'to be saved as'} s3://{stored.bucket}/{report} and removed from "
        f"the queue. To do: find the session by its sequenceNumber {stored.sequence_number} and eventID in the "
        "worker's logs and clean it by hand; in a versioned bucket, look for an older version of the object; check "
        "that no lifecycle rule expires DEAD_LETTER_PREFIX before the queue's retention."
    )


def marker_key(runtime: Runtime, stored: StoredRecord, state: Settled) -> str:
    """``<prefix><state>/<rest of the stored record's key>`` (the key is checked before it is built on)."""
    prefix = runtime.settings.dead_letter_prefix
    return f"{prefix}{state.value}/{stored.key[len(prefix) :]}"


def _put_marker(runtime: Runtime, stored: StoredRecord, state: Settled, about: dict[str, Any]) -> str:
    key = marker_key(runtime, stored, state)
    body = json.dumps({"format": MARKER_FORMAT, "state": state.value, "at": int(time.time()), **about}, default=str)
    s3 = runtime.clients.s3
    call(s3.put_object, "PutObject", None, Bucket=stored.bucket, Key=key, Body=body.encode(), ContentType=JSON)
    return key


def _check_location(runtime: Runtime, stored: StoredRecord) -> None:
    # The location comes from a message: read and delete only what the worker itself stores, where it stores it.
    settings = runtime.settings
    bucket, prefix = settings.dead_letter_store, settings.dead_letter_prefix
    if stored.bucket != bucket or not is_object_key(stored.key, prefix):
        raise PermanentError(
            f"the message names the object {str(stored)[:300]!r}, which is not a dead-letter object of this worker "
            f"(DEAD_LETTER_BUCKET {bucket!r}, DEAD_LETTER_PREFIX {prefix!r}): left alone"
        )
