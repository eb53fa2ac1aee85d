"""Stream records saved to files, read back whatever shape they were saved in.

A file holds one JSON document or JSON lines of documents. A document is one of:

* a Lambda event ``{"Records": [...]}`` (records name their ``eventSourceARN``), of a DynamoDB stream or of a
  Kinesis data stream (``aws:kinesis`` records, whose ``kinesis.data`` is decoded as the KCL's is),
* a GetRecords response ``{"Records": [...], "NextShardIterator": ...}``,
* one stream record (``{"dynamodb": {...}, ...}``, as ``cleanup-worker capture`` writes them, one per line),
* a KCL multilang ``processRecords`` message (records' ``data`` is the base64 JSON of a Kinesis-format change record;
  the sequence number is the Kinesis record's); other KCL messages carry no records and are passed over,
* a dead-letter message of this worker (the full record and its source). One whose record was too large for a message
  names the S3 object holding it instead: it is reported, with that location, and not processed (redrive its queue,
  or replay the object itself, which is the whole message).

Every record keeps where it came from (file, line, position in its document), so a malformed one is named exactly.

``FileReader`` reads JSON lines one line at a time, so memory stays bounded whatever the file's size (a one-document
file, a Lambda event or a GetRecords response, is read whole: AWS bounds those at 6 MB and 1 MB).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cleanup.exceptions import SourceFileError
from cleanup.operations.json_positions import element_lines, first_char, line_at
from cleanup.queues.deadletter import MESSAGE_FORMAT, message_record_id
from schemas.records import (
    RecordError,
    Source,
    StreamRecord,
    UnreadableRecord,
    is_kinesis_event_record,
    read_kinesis_data,
    read_record,
)

Incoming = StreamRecord | UnreadableRecord


@dataclass(frozen=True, slots=True)
class Location:
    """Where a record was found: ``file:line (Records[2])``."""

    file: str
    line: int | None = None
    path: str | None = None

    def __str__(self) -> str:
        text = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{text} ({self.path})" if self.path else text


@dataclass(frozen=True, slots=True)
class FileRecord:
    """A record read from a file, parsed or not (an unreadable one still has its sequence number)."""

    record: Incoming
    location: Location


@dataclass(frozen=True, slots=True)
class Rejected:
    """Something in a file that is not a record with a readable sequence number: reported, never processed."""

    location: Location
    error: str
    sequence_number: str | None = None


Entry = FileRecord | Rejected


def read_file(path: str | Path) -> list[Entry]:
    """Every record of one file, in file order.

    Raises:
        SourceFileError: the file cannot be read, is not JSON, or is JSON of no known shape.
    """
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceFileError(f"{name}: cannot read: {exc}") from exc
    try:
        document = json.loads(text)
    except json.JSONDecodeError as whole:
        return _read_lines(name, text, f"{name}:{whole.lineno}:{whole.colno}: not JSON: {whole.msg}")
    except RecursionError:  # one document too deep, or JSON lines whose first one is
        return _read_lines(name, text, f"{name}: JSON nested too deeply to read")
    entries = list(_document(document, text, Location(name, line_at(text, first_char(text)))))
    if entries and isinstance(entries[0], Rejected) and entries[0].error.startswith(_UNKNOWN):
        raise SourceFileError(f"{name}: {entries[0].error}")
    return entries


def _read_lines(name: str, text: str, whole: str) -> list[Entry]:
    """The file as JSON lines; ``whole`` says why it is not one JSON document, for a file that is not lines either."""
    lines = text.splitlines()
    first = next((n for n, line in enumerate(lines) if line.strip()), None)
    if first is None:
        return []
    if len([line for line in lines if line.strip()]) == 1:
        raise SourceFileError(whole)  # one document, and it cannot be read
    try:
        json.loads(lines[first])
    except RecursionError:
        pass  # JSON, only too deep: that line is reported below
    except json.JSONDecodeError:
        # Not JSON lines either: one JSON document that is broken; say where.
        raise SourceFileError(whole) from None
    return [entry for number, line in enumerate(lines, start=1) for entry in _line(Location(name, number), line)]


def _line(where: Location, line: str) -> Iterator[Entry]:
    """The records of one line of a JSON-lines file (none for a blank line)."""
    if not line.strip():
        return
    try:
        document = json.loads(line)
    except json.JSONDecodeError as exc:
        yield Rejected(where, f"not JSON at column {exc.colno}: {exc.msg}")
        return
    except RecursionError:
        yield Rejected(where, "JSON nested too deeply to read")
        return
    yield from _document(document, None, where)


class FileReader:
    """The entries of several files, one at a time, in file order (``read_file``'s, without holding them).

    ``bytes_read`` says how far the reading has come (for a progress bar over ``total_bytes``).
    """

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        self.bytes_read = 0

    @property
    def total_bytes(self) -> int:
        return sum(Path(path).stat().st_size for path in self.paths if Path(path).is_file())

    def __iter__(self) -> Iterator[Entry]:
        """Raises ``SourceFileError`` as ``read_file`` does (for JSON lines: only on the first line's account)."""
        for path in self.paths:
            if _is_json_lines(path):
                yield from self._lines(path)
            else:
                yield from read_file(path)
                self.bytes_read += Path(path).stat().st_size

    def _lines(self, path: str) -> Iterator[Entry]:
        with open(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                self.bytes_read += len(raw)
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    yield Rejected(Location(path, number), f"not UTF-8: {exc.reason}")
                    continue
                yield from _line(Location(path, number), line)


def _is_json_lines(path: str) -> bool:
    """Whether the file's first non-blank line is a JSON document of its own and another line follows: JSON lines,
    read line by line. Anything else (one document, however laid out) is ``read_file``'s to read and judge."""
    try:
        with open(path, "rb") as handle:
            lines = (raw for raw in handle if raw.strip())
            first, second = next(lines, None), next(lines, None)
    except OSError:
        return False  # read_file reports it
    if first is None or second is None:
        return False
    try:
        json.loads(first)
    except (ValueError, RecursionError):
        return False
    return True


_UNKNOWN = "not a known shape"


def _document(document: Any, text: str | None, where: Location) -> Iterator[Entry]:
    """The records of one document; ``text`` (a whole-file document) lets records be given their own line."""
    if not isinstance(document, dict):
        yield Rejected(where, f"{_UNKNOWN}: a JSON {type(document).__name__}, not an object")
    elif isinstance(document.get("Records"), list):
        yield from _records_document(document, text, where)
    elif document.get("action") is not None:
        yield from _kcl_message(document, text, where)
    elif document.get("format") == MESSAGE_FORMAT:
        yield _dead_letter(document, where)
    elif "dynamodb" in document:
        yield _entry(document, None, None, where)
    else:
        expected = "Lambda event, GetRecords response, stream record, KCL message or dead-letter message"
        yield Rejected(where, f"{_UNKNOWN}: expected a {expected}")


def _records_document(document: dict[str, Any], text: str | None, where: Location) -> Iterator[Entry]:
    records = document["Records"]
    is_lambda = "NextShardIterator" not in document and any(
        isinstance(raw, dict) and "eventSourceARN" in raw for raw in records
    )
    source = Source.LAMBDA if is_lambda else Source.STREAMS
    lines = element_lines(text, "Records", len(records))
    for index, raw in enumerate(records):
        place = Location(where.file, lines[index] if lines else where.line, f"Records[{index}]")
        if is_kinesis_event_record(raw):  # a Lambda event of a Kinesis data stream
            yield _kinesis_record(raw["kinesis"], place)
        else:
            yield _entry(raw, source, None, place)


def _kcl_message(message: dict[str, Any], text: str | None, where: Location) -> Iterator[Entry]:
    if message.get("action") != "processRecords":
        return  # initialize, checkpoint, shutdownRequested...: no records
    records = message.get("records")
    if not isinstance(records, list):
        yield Rejected(where, "KCL processRecords message without a 'records' list")
        return
    lines = element_lines(text, "records", len(records))
    for index, kinesis in enumerate(records):
        place = Location(where.file, lines[index] if lines else where.line, f"records[{index}]")
        yield _kinesis_record(kinesis, place)


def _kinesis_record(kinesis: Any, where: Location) -> Entry:
    sequence_number = kinesis.get("sequenceNumber") if isinstance(kinesis, dict) else None
    if not isinstance(sequence_number, str) or not sequence_number:
        return Rejected(where, "Kinesis record without a sequenceNumber (its record cannot be reported)")
    return FileRecord(read_kinesis_data(kinesis.get("data"), sequence_number), where)


def _dead_letter(message: dict[str, Any], where: Location) -> Entry:
    if "record" not in message and "recordObject" in message:
        return _stored(message, where)
    try:
        source = Source(message["source"]) if message.get("source") else None
    except ValueError:
        return Rejected(where, f"dead-letter message with an unknown source {message.get('source')!r}")
    sequence_number = message_record_id(message) if source is Source.KINESIS else None
    return _entry(message.get("record"), source, sequence_number, Location(where.file, where.line, "record"))


def _stored(message: dict[str, Any], where: Location) -> Rejected:
    location = message["recordObject"]
    if isinstance(location, dict):
        location = f"s3://{location.get('bucket')}/{location.get('key')}"
    number = message.get("sequenceNumber")
    return Rejected(
        Location(where.file, where.line, "recordObject"),
        f"dead-letter message whose record is stored in S3, at {str(location)[:300]!r}: run cleanup-worker redrive "
        "on its queue, or download that object and replay it",
        number if isinstance(number, str) else None,
    )


def _entry(raw: Any, source: Source | None, sequence_number: str | None, where: Location) -> Entry:
    try:
        return FileRecord(read_record(raw, source, sequence_number), where)
    except RecordError as exc:
        return Rejected(where, f"{exc} (its sequence number cannot be read)")
