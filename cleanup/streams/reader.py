"""Reading a DynamoDB stream: its shards and their lineage, iterators, and pages exactly as the service sent them.

The one reader of the stream poller, ``capture`` and ``redrive``:

* ``latest_stream_arn``, ``list_shards`` and ``startable`` (``cleanup.streams.discovery``): a table's stream, its
  shards, and which of them may be read now.
* ``ShardReader``: one shard, page after page, from a position. An iterator lives 15 minutes: an expired one is
  opened again just after the last record read. A position older than the stream's 24-hour retention starts over at
  the shard's oldest record, and the reader says after which record the gap begins (``gap_after``).
  LATEST is no position one can come back to: a reader started there names one (``resume_point``) for the consumer
  to keep, the first record it hands out or, until then, the service's time when it started. Read again from that
  time, the shard is read from its oldest record, passing over the records written before the start.
* ``raw_get_records``: boto3 turns ApproximateCreationDateTime into a datetime and binary values into bytes; capture,
  replay and the dead-letter queue want the wire JSON (base64 binary, epoch seconds), so the raw body is kept.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

from cleanup.aws.answers import needed
from cleanup.aws.calls import call_or_gone
from cleanup.exceptions import IteratorExpiredError, StreamNotFoundError, TrimmedDataError
from cleanup.streams.checkpoints import Checkpoint
from cleanup.streams.discovery import Shard, latest_stream_arn, list_shards, startable
from cleanup.telemetry import log
from schemas.settings import StartPosition

if TYPE_CHECKING:
    from mypy_boto3_dynamodbstreams import DynamoDBStreamsClient

__all__ = [
    "EMPTY_READS_AT_END",
    "IDLE_AFTER_EMPTY_READS",
    "Page",
    "Shard",
    "ShardReader",
    "latest_stream_arn",
    "list_shards",
    "open_iterator",
    "raw_get_records",
    "read_page",
    "startable",
]

EMPTY_READS_AT_END = 3
"""An open shard can answer empty before records that are there: this many empty reads in a row end a one-off read
to the end (``capture``, ``redrive``)."""
LATEST_MARGIN_SECONDS = 60.0
"""Read again from a LATEST start's time, records up to this much older are read too: a record's creation time and
the service's clock are rounded to the second, and may not be one clock. Reading a record before the start is
harmless; passing over one after it is not."""
IDLE_AFTER_EMPTY_READS = 1
"""A consumer that keeps polling (the stream poller) counts a shard idle at its first empty read: whatever comes
later is read on its next poll (or by the next ``run --until-idle``, from the checkpoint)."""


@dataclass(frozen=True, slots=True)
class Page:
    """One GetRecords answer: the records as sent, and the next iterator (None at the end of a closed shard)."""

    records: list[dict[str, Any]]
    next_iterator: str | None


def open_iterator(
    streams: DynamoDBStreamsClient,
    stream_arn: str,
    shard_id: str,
    *,
    after: str | None = None,
    at: str | None = None,
    start: StartPosition | str = StartPosition.TRIM_HORIZON,
) -> str:
    """An iterator just after ``after``, at ``at``, or else at ``start``.

    Raises:
        TrimmedDataError: the position is older than the stream's retention.
        StreamNotFoundError: the stream or the shard does not exist (any more).
        TransientError / PermanentError: throttling, a server error, access denied.
    """
    return dated_iterator(streams, stream_arn, shard_id, after=after, at=at, start=start)[0]


def dated_iterator(
    streams: DynamoDBStreamsClient,
    stream_arn: str,
    shard_id: str,
    *,
    after: str | None = None,
    at: str | None = None,
    start: StartPosition | str = StartPosition.TRIM_HORIZON,
) -> tuple[str, float]:
    """``open_iterator``, and the service's time when it answered (epoch seconds; this host's, if it names none)."""
    request: dict[str, Any] = {"StreamArn": stream_arn, "ShardId": shard_id, "ShardIteratorType": str(start)}
    if after is not None:
        request.update(ShardIteratorType="AFTER_SEQUENCE_NUMBER", SequenceNumber=after)
    elif at is not None:
        request.update(ShardIteratorType="AT_SEQUENCE_NUMBER", SequenceNumber=at)
    answer = _stream_call(streams.get_shard_iterator, "GetShardIterator", **request)
    if answer is None:
        raise StreamNotFoundError(f"shard {shard_id} of {stream_arn} does not exist")
    return str(needed(answer, "GetShardIterator", "ShardIterator", kind=str)), _service_time(answer)


def _service_time(answer: dict[str, Any]) -> float:
    try:
        return float(parsedate_to_datetime(answer["ResponseMetadata"]["HTTPHeaders"]["date"]).timestamp())
    except (KeyError, TypeError, ValueError):
        return time.time()


def read_page(streams: DynamoDBStreamsClient, iterator: str, limit: int | None = None) -> Page:
    """One GetRecords call, the records kept as the service sent them.

    Raises:
        IteratorExpiredError: the iterator is older than 15 minutes.
        TrimmedDataError: the iterator points before the stream's retention.
        StreamNotFoundError: the stream, or the shard, is no longer there.
        TransientError: throttling (LimitExceededException) or a server error.
        PermanentError: anything else.
    """
    response = _stream_call(raw_get_records, "GetRecords", streams=streams, shard_iterator=iterator, limit=limit)
    if response is None:
        raise StreamNotFoundError("GetRecords: the stream or its shard no longer exists")
    return Page(list(response.get("Records", [])), response.get("NextShardIterator"))


class ShardReader:
    """One shard, read page after page from a position (see the module's docstring)."""

    def __init__(
        self,
        streams: DynamoDBStreamsClient,
        stream_arn: str,
        shard_id: str,
        *,
        after: str | None = None,
        at: str | None = None,
        since: float | None = None,
        start: StartPosition | str = StartPosition.TRIM_HORIZON,
        limit: int | None = None,
        empty_reads_at_end: int = EMPTY_READS_AT_END,
    ) -> None:
        """From just after ``after``, at ``at``, from the records written since ``since`` (a LATEST start's time),
        or else at ``start``; in that order."""
        self.streams, self.stream_arn, self.shard_id = streams, stream_arn, shard_id
        self.empty_reads_at_end = empty_reads_at_end
        self.last = after
        """The last record read (or the position to read after)."""
        self.ended = False
        """The end of a closed shard was reached."""
        self.empty_reads = 0
        self.gap_after: str | None = None
        """Set when the position was trimmed: the records after it, up to the next page's first, were lost."""
        self.first: str | None = None
        """The first record handed out."""
        self.since = since
        """A LATEST start's time (the service's), until it hands out a record."""
        self._pinned = at is not None or since is not None or (after is None and start == StartPosition.LATEST)
        self._skip_before = None if since is None else since - LATEST_MARGIN_SECONDS
        self._at, self._start, self._limit = at, start, limit
        self._iterator: str | None = None

    def resume_point(self) -> Checkpoint | None:
        """Where to read again from to see every record this reader has handed out, or will, when it started at
        LATEST (or at such a point); None for any other start, which is a position already."""
        if not self._pinned:
            return None
        if self.first is not None:
            return Checkpoint(None, at=self.first)
        if self.since is not None:
            return Checkpoint(self.last, since=self.since)
        return None

    def peek(self) -> dict[str, Any] | None:
        """The next record this reader would hand out, read apart (a GetShardIterator and at most
        ``EMPTY_READS_AT_END`` GetRecords), without moving the reader; None when none is there yet.

        Raises:
            TransientError / PermanentError: as ``read``.
        """
        fresh = self.last is None
        since = self.since if fresh and self.first is None else None
        probe = ShardReader(
            self.streams,
            self.stream_arn,
            self.shard_id,
            after=self.last,
            at=self._at if fresh else None,
            since=since,
            start=self._start,
            limit=None if since is not None else 1,  # passing over records from before a LATEST start takes pages
        )
        while not probe.drained:
            records = probe.read().records
            if records:
                return records[0]
        return None

    @property
    def drained(self) -> bool:
        """Nothing more to read for now: the shard ended, or answered empty ``empty_reads_at_end`` times in a row."""
        return self.ended or self.empty_reads >= self.empty_reads_at_end

    def read(self) -> Page:
        """The next page (its records may be none).

        Raises:
            TransientError / PermanentError: as ``read_page`` and ``open_iterator``; the reader stays usable.
        """
        if self._iterator is None:
            self._iterator = self._open()
        try:
            page = read_page(self.streams, self._iterator, self._limit)
        except IteratorExpiredError:
            log.info("shard iterator expired; opening a new one", extra={"shardId": self.shard_id, "after": self.last})
            self._iterator = self._open()
            page = read_page(self.streams, self._iterator, self._limit)
        except TrimmedDataError:
            self._iterator = None
            raise
        self._iterator = page.next_iterator
        self.ended = page.next_iterator is None
        self.empty_reads = 0 if page.records else self.empty_reads + 1
        if page.records:
            self.last = str(page.records[-1]["dynamodb"]["SequenceNumber"])
        records = self._since_the_start(page.records)
        if records and self.first is None:
            self.first = str(records[0]["dynamodb"]["SequenceNumber"])
        return Page(records, page.next_iterator)

    def _since_the_start(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The records from the first one written after a LATEST start (the ones before it are passed over)."""
        if self._skip_before is None:
            return records
        for n, record in enumerate(records):
            created = record.get("dynamodb", {}).get("ApproximateCreationDateTime")
            if not isinstance(created, int | float) or created >= self._skip_before:
                self._skip_before = None
                return records[n:]
        return []

    def _open(self) -> str:
        try:
            if self.last is not None:
                return open_iterator(self.streams, self.stream_arn, self.shard_id, after=self.last)
            if self._at is not None:
                return open_iterator(self.streams, self.stream_arn, self.shard_id, at=self._at)
            if self.since is not None:  # read again from a LATEST start: the oldest record on, passing over some
                self._skip_before = self.since - LATEST_MARGIN_SECONDS
                return open_iterator(self.streams, self.stream_arn, self.shard_id)
            iterator, now = dated_iterator(self.streams, self.stream_arn, self.shard_id, start=self._start)
            if self._start == StartPosition.LATEST:
                self.since = now
            return iterator
        except TrimmedDataError:
            self.gap_after = self.last or self._at
            return open_iterator(self.streams, self.stream_arn, self.shard_id, start=StartPosition.TRIM_HORIZON)


def _stream_call(method: Any, what: str, **kwargs: Any) -> Any:
    return call_or_gone(method, what, None, ("ResourceNotFoundException",), **kwargs)


_local = threading.local()


def _keep_body(http_response: Any, **_: Any) -> None:
    _local.body = http_response.content


def raw_get_records(streams: DynamoDBStreamsClient, shard_iterator: str, limit: int | None = None) -> dict[str, Any]:
    """GetRecords, returning the response's JSON as sent (``Records`` and ``NextShardIterator``)."""
    event = "after-call.dynamodbstreams.GetRecords"
    streams.meta.events.register(event, _keep_body, unique_id="cleanup-keep-body")
    kwargs: dict[str, Any] = {"ShardIterator": shard_iterator}
    if limit is not None:
        kwargs["Limit"] = limit
    _local.body = None
    parsed = streams.get_records(**kwargs)
    body = _local.body
    if not body:
        return {"Records": [], "NextShardIterator": parsed.get("NextShardIterator")}
    raw: dict[str, Any] = json.loads(body)
    return raw
