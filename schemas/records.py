"""Stream records in the three shapes the worker is handed, normalised into one model.

* ``lambda``: an event source mapping's record (``eventSourceARN``; ApproximateCreationDateTime in epoch seconds).
* ``streams``: a DynamoDB Streams GetRecords record, as the service returns it (epoch seconds).
* ``kinesis``: a record as Kinesis Data Streams for DynamoDB delivers it, to the KCL or in a Lambda ``aws:kinesis``
  event: the base64 JSON ``data`` of a change record with ``tableName`` and ``recordFormat``, its
  ApproximateCreationDateTime in epoch milliseconds (or microseconds, the streaming destination's
  ``ApproximateCreationDateTimePrecision``), and the sequence number from the Kinesis record rather than from the
  payload. ``read_kinesis_data`` is the one decoder of that ``data``.

A record is named by its ``sequence_number``, which is its id in the stream: the stream's sequence number, except for
a record the KCL de-aggregated from a KPL aggregate. Such records share their Kinesis sequence number and differ by
their sub-sequence number, so from sub-sequence number 1 on the id is ``<sequence number>/<sub-sequence number>``
(``record_id``; ``split_record_id`` reverses it). Every outcome, retry, checkpoint and dead letter goes by that id,
and a Lambda record, never aggregated, keeps the plain sequence number its batchItemFailures must name.

The images stay in their AttributeValue JSON form here; ``schemas.attributes`` decodes them on demand.
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

KINESIS_EVENT_SOURCE = "aws:kinesis"
# A Kinesis-format creation time above this is in microseconds: as epoch milliseconds it would be after the year
# 5000, as microseconds it is after 1973.
_MICROSECONDS_FROM = 100_000_000_000_000


def record_id(sequence_number: str, sub_sequence_number: int | None = None) -> str:
    """The id of a record: its sequence number, with ``/<sub-sequence number>`` when that is above 0."""
    return f"{sequence_number}/{sub_sequence_number}" if sub_sequence_number else sequence_number


def split_record_id(identifier: str) -> tuple[str, int | None]:
    """A record's sequence number and sub-sequence number (None when the id has none), from ``record_id``."""
    number, _, sub = identifier.partition("/")
    return (number, int(sub)) if sub.isdigit() else (identifier, None)


class Source(StrEnum):
    """Where a record came from, which fixes the unit of its creation time."""

    LAMBDA = "lambda"
    STREAMS = "streams"
    KINESIS = "kinesis"


class RecordError(ValueError):
    """A stream record that cannot be read; ``sequence_number`` is set when it could be found."""

    def __init__(self, message: str, sequence_number: str | None = None) -> None:
        super().__init__(message)
        self.sequence_number = sequence_number


class UserIdentity(BaseModel):
    """The ``userIdentity`` of a record; DynamoDB TTL deletes carry type Service, dynamodb.amazonaws.com."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    type: str | None = Field(default=None, validation_alias="type")
    principal_id: str | None = Field(default=None, validation_alias="principalId")

    @classmethod
    def parse(cls, raw: object) -> UserIdentity | None:
        """Accept both spellings (``type``/``principalId`` and ``Type``/``PrincipalId``)."""
        if not isinstance(raw, dict):
            return None
        return cls(
            type=raw.get("type", raw.get("Type")),
            principal_id=raw.get("principalId", raw.get("PrincipalId")),
        )

    @property
    def is_ttl_service(self) -> bool:
        return self.type == "Service" and self.principal_id == "dynamodb.amazonaws.com"


class StreamRecord(BaseModel):
    """One change record, whatever shape it arrived in. ``raw`` keeps the record exactly as received."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    sequence_number: str
    """The record's id (``record_id``): its sequence number, and its sub-sequence number when the KCL gave one."""
    event_id: str | None
    event_name: str | None
    source: Source
    created_at: float | None
    """ApproximateCreationDateTime in epoch seconds, whatever the source's unit."""
    keys: dict[str, Any]
    old_image: dict[str, Any] | None
    new_image: dict[str, Any] | None
    user_identity: UserIdentity | None
    event_source_arn: str | None
    table_name: str | None
    stream_view_type: str | None
    raw: dict[str, Any] = Field(repr=False)

    @property
    def table(self) -> str | None:
        """The table the record came from: named by the stream ARN, else by the Kinesis payload."""
        return stream_table(self.event_source_arn) or self.table_name


def stream_table(stream_arn: str | None) -> str | None:
    """The table a DynamoDB stream's ARN names (``arn:...:table/<name>/stream/<label>``); None for any other ARN."""
    if stream_arn and ":table/" in stream_arn:
        return stream_arn.split(":table/", 1)[1].split("/", 1)[0] or None
    return None


class _Change(BaseModel):
    model_config = ConfigDict(extra="ignore")

    ApproximateCreationDateTime: float | datetime | None = None
    Keys: dict[str, Any] = Field(default_factory=dict)
    OldImage: dict[str, Any] | None = None
    NewImage: dict[str, Any] | None = None
    SequenceNumber: str | None = None
    StreamViewType: str | None = None


class _Envelope(BaseModel):
    model_config = ConfigDict(extra="ignore")

    eventID: str | None = None
    eventName: str | None = None
    eventSourceARN: str | None = None
    tableName: str | None = None
    dynamodb: _Change


def sequence_number_of(raw: object) -> str | None:
    """The record's own sequence number, if it can be read at all (used before full parsing)."""
    if isinstance(raw, dict):
        change = raw.get("dynamodb")
        if isinstance(change, dict):
            number = change.get("SequenceNumber")
            if isinstance(number, str) and number:
                return number
    return None


def detect_source(raw: dict[str, Any]) -> Source:
    """Guess a lone record's shape: a Lambda record names its ARN, a Kinesis payload its table."""
    if "eventSourceARN" in raw:
        return Source.LAMBDA
    if "tableName" in raw or "recordFormat" in raw:
        return Source.KINESIS
    return Source.STREAMS


def parse_record(raw: object, source: Source | None = None, sequence_number: str | None = None) -> StreamRecord:
    """Normalise one raw record.

    Args:
        raw: the record as received (JSON-decoded).
        source: its shape; detected when omitted.
        sequence_number: the sequence number when the transport carries it outside the payload (Kinesis / KCL).

    Raises:
        RecordError: the record is not a stream record; the error carries the sequence number when known.
    """
    seq = sequence_number or sequence_number_of(raw)
    if not isinstance(raw, dict):
        raise RecordError(f"record is not a JSON object: {type(raw).__name__}", seq)
    if source is None:
        source = detect_source(raw)
    try:
        envelope = _Envelope.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise RecordError(f"malformed stream record at {where}: {first['msg']}", seq) from None
    if not seq:
        raise RecordError("stream record has no SequenceNumber", None)
    try:
        identity = UserIdentity.parse(raw.get("userIdentity"))
    except ValidationError as exc:  # e.g. a non-string type: the record is malformed, not the batch
        raise RecordError(f"malformed stream record at userIdentity: {exc.errors()[0]['msg']}", seq) from None
    change = envelope.dynamodb
    created = change.ApproximateCreationDateTime
    if isinstance(created, datetime):  # a record already parsed by boto3
        created = created.timestamp()
    elif created is not None and source is Source.KINESIS:
        created /= 1_000_000.0 if created >= _MICROSECONDS_FROM else 1000.0
    return StreamRecord(
        sequence_number=seq,
        event_id=envelope.eventID,
        event_name=envelope.eventName,
        source=source,
        created_at=created,
        keys=change.Keys,
        old_image=change.OldImage,
        new_image=change.NewImage,
        user_identity=identity,
        event_source_arn=envelope.eventSourceARN,
        table_name=envelope.tableName,
        stream_view_type=change.StreamViewType,
        raw=raw,
    )


class UnreadableRecord(BaseModel):
    """A record that could not be parsed; it is still reported (by sequence number), never dropped."""

    model_config = ConfigDict(frozen=True)

    sequence_number: str
    error: str
    raw: Any = Field(default=None, repr=False)


def read_record(
    raw: object, source: Source | None = None, sequence_number: str | None = None
) -> StreamRecord | UnreadableRecord:
    """``parse_record``, turning a malformed record into an ``UnreadableRecord``.

    Raises:
        RecordError: not even the sequence number can be read, so the record could not be reported.
    """
    try:
        return parse_record(raw, source, sequence_number)
    except RecordError as exc:
        if not exc.sequence_number:
            raise
        return UnreadableRecord(sequence_number=exc.sequence_number, error=str(exc), raw=raw)


def read_kinesis_data(data: object, sequence_number: str) -> StreamRecord | UnreadableRecord:
    """A Kinesis record's ``data`` (the base64 JSON of a DynamoDB change record) as a stream record.

    Data that is not base64 JSON of a change record becomes an ``UnreadableRecord`` under the Kinesis record's
    sequence number: it is reported, never a crash.
    """
    try:
        blob = base64.b64decode(data, validate=True)  # type: ignore[arg-type]  # anything else is a TypeError
    except (binascii.Error, ValueError, TypeError) as exc:
        return UnreadableRecord(
            sequence_number=sequence_number, error=f"record data is not base64 JSON: {exc}", raw=data
        )
    return read_kinesis_bytes(blob, sequence_number, raw=data)


def read_kinesis_bytes(blob: bytes, sequence_number: str, raw: object = None) -> StreamRecord | UnreadableRecord:
    """A Kinesis record's data already decoded from base64 (as boto3's GetRecords returns ``Data``)."""
    try:
        payload = json.loads(blob)
    except (ValueError, RecursionError) as exc:  # bad JSON, bad UTF-8, and JSON nested deeper than Python recurses
        return UnreadableRecord(
            sequence_number=sequence_number,
            error=f"record data is not base64 JSON: {exc}",
            raw=raw if raw is not None else base64.b64encode(blob).decode(),
        )
    return read_record(payload, Source.KINESIS, sequence_number=sequence_number)


def is_kinesis_event_record(raw: object) -> bool:
    """Whether a Lambda event's record came from a Kinesis data stream (``eventSource`` ``aws:kinesis``)."""
    if not isinstance(raw, dict):
        return False
    return raw.get("eventSource") == KINESIS_EVENT_SOURCE or isinstance(raw.get("kinesis"), dict)


def read_kinesis_event_record(raw: dict[str, Any]) -> StreamRecord | UnreadableRecord:
    """One record of a Lambda Kinesis event: its ``kinesis.data`` decoded, named by ``kinesis.sequenceNumber``.

    Raises:
        RecordError: the record has no Kinesis sequence number (it could be neither reported nor retried).
    """
    kinesis = raw.get("kinesis")
    number = kinesis.get("sequenceNumber") if isinstance(kinesis, dict) else None
    if not isinstance(kinesis, dict) or not isinstance(number, str) or not number:
        raise RecordError("Kinesis record has no kinesis.sequenceNumber")
    return read_kinesis_data(kinesis.get("data"), number)


def read_lambda_event(event: object) -> list[StreamRecord | UnreadableRecord]:
    """The records of a Lambda event (``{"Records": [...]}``) of a DynamoDB stream or of a Kinesis data stream.

    A Kinesis record (``eventSource`` ``aws:kinesis``) carries a DynamoDB change record in its ``data`` (Kinesis
    Data Streams for DynamoDB) and is named by its Kinesis sequence number.

    Raises:
        RecordError: the event has no ``Records`` list, or a record's sequence number cannot be read (such a record
            could be neither reported nor retried, so the whole invocation must fail).
    """
    if not isinstance(event, dict) or not isinstance(event.get("Records"), list):
        raise RecordError('not a DynamoDB Streams or Kinesis event: expected {"Records": [...]}')
    records = []
    for position, raw in enumerate(event["Records"]):
        try:
            if is_kinesis_event_record(raw):
                records.append(read_kinesis_event_record(raw))
            else:
                records.append(read_record(raw, Source.LAMBDA))
        except RecordError as exc:
            raise RecordError(f"record {position} of the event: {exc}; its sequence number cannot be read") from exc
    return records
