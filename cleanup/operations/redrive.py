"""Redriving failed batches: turn a failure message back into records, and clean them through the core.

Two kinds of message name records to redo:

* a Lambda on-failure destination message (``DDBStreamBatchInfo``: stream, shard, first and last sequence number,
  batch size; or ``KinesisBatchInfo``, the same for a mapping on a Kinesis data stream). It carries no records: the
  range is read again from the stream (AT_SEQUENCE_NUMBER, then GetRecords until past the last sequence number,
  compared as integers), from the DynamoDB stream or from the Kinesis data stream, whose records' data is decoded
  as the Lambda handler and the KCL processor decode it. Records the stream no longer holds (trimmed after its
  retention, or the stream deleted) are reported lost, by sequence number;
* this worker's own dead-letter message (``cleanup.queues.deadletter``), which carries the whole record, or, when the
  record was too large for a message, names the S3 object holding it (``recordObject``). That object is read back
  (GetObject), only from DEAD_LETTER_BUCKET under DEAD_LETTER_PREFIX and only by a key the worker makes, and deleted
  once its record is clean, after a marker saying so (``cleanup.queues.claim_check``). A message whose object is
  missing is a duplicate when the marker is there, and goes; with no marker the record was lost some other way: the
  message is saved beside where the object was, reported once (``gone``), and goes.

A dead-letter message is trusted only once its integrity tag verifies (``cleanup.queues.integrity``: the worker wrote
it, and nobody changed it since), and a stored record only once its bytes match the digest the tag covers. One that
fails is refused: nothing it names is freed, it is counted (``MessagesRefused``) and logged, and it stays on the
queue for an operator. An on-failure message needs no tag: it names only a range of SESSION_TABLE's stream, whose
records are read again from the stream itself. Any body that is neither (any JSON, any type in any field) is reported
alone and kept; the other messages go on.

Only SESSION_TABLE's records are sessions: an on-failure message naming another table's DynamoDB stream is refused
(reported and kept, nothing read), and a record naming another table is skipped (``cleanup.core.classify``).

A message may be deleted only when ``MessageResult.settled``: every record in it cleaned or already clean (an insert
or a modify needs nothing), none skipped, failed or lost, and its stored object (if any) deleted; or its stored
record gone and reported. A removal skipped is not clean: it was judged under the settings of this run (a session
key prefix, attribute names, SESSION_TABLE), which may not be the function's; its message stays, and the skip is
reported with its reason (``cleanup-worker redrive --function-name`` runs with the function's own settings).
"""

from __future__ import annotations

import json
from typing import Any

from cleanup.core.pipeline import Incoming
from cleanup.exceptions import CleanupError, IntegrityError, MessageFormatError
from cleanup.operations.redrive_result import MessageResult
from cleanup.operations.stream_ranges import BatchRange, read_kinesis_range, read_range
from cleanup.queues.claim_check import (
    Settled,
    StoredRecord,
    delete_stored,
    lost_advice,
    marker_key,
    read_stored,
    report_lost,
    settled,
)
from cleanup.queues.deadletter import MESSAGE_FORMAT, message_record_id
from cleanup.queues.integrity import DIGEST_FIELD
from cleanup.queues.integrity_check import refused, verify
from cleanup.queues.reporting import run_batch
from cleanup.runtime import Runtime
from schemas.records import RecordError, Source, read_record, stream_table
from schemas.settings import CleanupMode


def redrive(body: str, runtime: Runtime) -> MessageResult:
    """Clean the records one message names. Never raises for a bad message: it is reported and kept.

    A record read from a stored object is cleaned first; the object is deleted only then, only if it is clean, and
    never in a dry run (the record was only planned, and the object is all that holds it).
    """
    try:
        loaded = load_message(body)
        if loaded.get("format") == MESSAGE_FORMAT:
            verify(loaded, runtime)  # before anything it names is read, let alone freed
        message = message_from(loaded)
    except IntegrityError as exc:
        refused(runtime, _message_id(body), "integrity", str(exc), "the queue")
        return MessageResult("dead-letter", error=f"refused, integrity: {exc}")
    except CleanupError as exc:
        return MessageResult("unknown", error=str(exc))
    except Exception as exc:  # the per-message boundary: whatever the message holds, it fails alone
        return MessageResult("unknown", error=f"unreadable message: {type(exc).__name__}: {exc}")
    if isinstance(message, StoredRecord):
        return _redrive_stored(message, runtime)
    kind = "on-failure" if isinstance(message, BatchRange) else "dead-letter"
    foreign = foreign_stream(message, runtime.settings.session_table)
    if foreign is not None:
        return MessageResult(kind, error=foreign)
    try:
        records, result = _records(message, runtime)
    except CleanupError as exc:
        return MessageResult(kind, error=str(exc))
    result.outcomes = run_batch(records, runtime) if records else []
    return result


def _redrive_stored(stored: StoredRecord, runtime: Runtime) -> MessageResult:
    """Clean the record an object holds, then mark it redriven and delete the object; or settle a missing one."""
    enforce = runtime.settings.cleanup_mode is CleanupMode.ENFORCE
    try:
        whole = read_stored(runtime, stored)
        if whole is None:
            return _missing(stored, runtime, enforce=enforce)
        result = MessageResult("dead-letter", outcomes=run_batch([_dead_lettered(whole)], runtime))
    except IntegrityError as exc:
        refused(runtime, _message_id(stored.message), "integrity", str(exc), "the queue (its object left in S3)")
        return MessageResult("dead-letter", error=f"refused, integrity: {exc}")
    except CleanupError as exc:
        return MessageResult("dead-letter", error=str(exc))
    if result.clean and enforce:
        try:
            delete_stored(runtime, stored)
        except CleanupError as exc:
            result.error = f"the record is clean but its object {stored} could not be deleted: {exc}"
    return result


def _missing(stored: StoredRecord, runtime: Runtime, *, enforce: bool) -> MessageResult:
    """A message whose object is missing: a duplicate of one settled (it goes), or a record lost, reported once.

    Raises:
        TransientError / PermanentError: the markers could not be read, or the report saved (the message stays).
    """
    state = settled(runtime, stored)
    if state is Settled.REDRIVEN:
        return MessageResult("dead-letter", duplicate=f"its record was already redriven (object {stored} deleted)")
    if state is Settled.LOST:
        return MessageResult("dead-letter", duplicate=f"its record's object {stored} was already reported lost")
    saved = report_lost(runtime, stored) if enforce else marker_key(runtime, stored, Settled.LOST)
    return MessageResult("dead-letter", gone=lost_advice(stored, saved, saved=enforce))


def foreign_stream(message: BatchRange | StoredRecord | Incoming, session_table: str | None) -> str | None:
    """Why an on-failure message's DynamoDB stream is not to be read (None: it is SESSION_TABLE's, or the message
    names no DynamoDB stream). Another table's REMOVEs are not sessions, and a message may name any stream.

    A Kinesis data stream may carry several tables': its records are judged one by one, by the table each names.
    """
    if not isinstance(message, BatchRange) or message.kinesis:
        return None
    table = stream_table(message.stream_arn)
    if session_table is not None and table == session_table:
        return None
    return (
        f"refused: stream {message.stream_arn} is not SESSION_TABLE {session_table!r}'s "
        f"(it is {'table ' + repr(table) if table else 'no table'}'s); nothing was read from it"
    )


def _records(message: BatchRange | Incoming, runtime: Runtime) -> tuple[list[Incoming], MessageResult]:
    if isinstance(message, BatchRange) and message.kinesis:
        records, lost, missing = read_kinesis_range(runtime.clients.kinesis, message)
        return records, MessageResult("on-failure", lost=lost, missing=missing)
    if isinstance(message, BatchRange):
        records, lost, missing = read_range(runtime.clients.streams, message)
        return records, MessageResult("on-failure", lost=lost, missing=missing)
    return [message], MessageResult("dead-letter")


def parse_message(body: str) -> BatchRange | StoredRecord | Incoming:
    """The range an on-failure message names, or the record a dead-letter message carries (or where it is stored);
    its integrity tag, if any, is not checked here (:func:`redrive` checks it first).

    Raises:
        MessageFormatError: neither kind of message (an SNS envelope around one is unwrapped).
    """
    return message_from(load_message(body))


def load_message(body: str) -> dict[str, Any]:
    """A message as a JSON object (an SNS envelope around one is unwrapped).

    Raises:
        MessageFormatError: not a JSON object.
    """
    try:
        message = json.loads(body)
        if isinstance(message, dict) and message.get("Type") == "Notification":
            message = json.loads(message["Message"])  # an SNS destination subscribed to the queue
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise MessageFormatError(f"message is not JSON: {exc}") from exc
    if not isinstance(message, dict):
        raise MessageFormatError("message is not a JSON object")
    return message


def message_from(message: dict[str, Any]) -> BatchRange | StoredRecord | Incoming:
    """What a loaded message names (see :func:`parse_message`).

    Raises:
        MessageFormatError: neither kind of message.
    """
    for name in ("DDBStreamBatchInfo", "KinesisBatchInfo"):
        if isinstance(message.get(name), dict):
            return _batch_range(message[name], name)
    if message.get("format") == MESSAGE_FORMAT:
        if "record" not in message and "recordObject" in message:
            return _stored(message)
        return _dead_lettered(message)
    raise MessageFormatError(
        "neither a Lambda on-failure message (DDBStreamBatchInfo or KinesisBatchInfo) nor a dead-letter message"
    )


def _batch_range(info: dict[str, Any], name: str) -> BatchRange:
    try:
        start, end = str(info["startSequenceNumber"]), str(info["endSequenceNumber"])
        if not all(n.isascii() and n.isdigit() for n in (start, end)):  # they are compared as integers
            raise ValueError("sequence number")
        size = info.get("batchSize")
        return BatchRange(
            str(info["streamArn"]),
            str(info["shardId"]),
            start,
            end,
            int(size) if size else None,
            kinesis=name == "KinesisBatchInfo",
        )
    except (KeyError, ValueError, TypeError, OverflowError) as exc:
        raise MessageFormatError(f"{name} without a usable {exc}") from exc


def _dead_lettered(message: dict[str, Any]) -> Incoming:
    try:
        source = Source(message["source"]) if message.get("source") else None
        number = message_record_id(message) if source is Source.KINESIS else None
        return read_record(message.get("record"), source, number)
    except (ValueError, RecordError) as exc:
        raise MessageFormatError(f"dead-letter message without a readable record: {exc}") from exc


def _stored(message: dict[str, Any]) -> StoredRecord:
    where = message["recordObject"]
    if not isinstance(where, dict) or not all(isinstance(where.get(name), str) for name in ("bucket", "key")):
        raise MessageFormatError("dead-letter message whose recordObject has no bucket and key")
    version = where.get("versionId")
    number = message.get("sequenceNumber")
    return StoredRecord(
        where["bucket"],
        where["key"],
        version if isinstance(version, str) and version else None,
        number if isinstance(number, str) else None,
        message,
        digest=message.get(DIGEST_FIELD),
    )


def _message_id(message: object) -> str:
    """What names a refused message in the log: its sequence number and event id, when it has them."""
    if isinstance(message, str):
        try:
            message = json.loads(message)
        except (ValueError, RecursionError):
            return "?"
    if not isinstance(message, dict):
        return "?"
    return f"{str(message.get('sequenceNumber'))[:64]}/{str(message.get('eventID'))[:64]}"
