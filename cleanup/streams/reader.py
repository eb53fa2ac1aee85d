"""Reading a DynamoDB stream: its shards and their lineage, iterators, and pages exactly as the service sent them.

The one reader of the stream poller, ``capture`` and ``redrive``:

* ``latest_stream_arn``: a table's current stream (also one that was disabled: it still holds 24 hours of records).
* ``list_shards`` and ``startable``: DynamoDB Streams splits a shard about every four hours: the parent closes (its
  SequenceNumberRange gets an EndingSequenceNumber) and children name it in ParentShardId. Records of one item move
  from the parent to a child, so a child may only be read once its parent is finished, or they would be handled out
  of order.
* ``ShardReader``: one shard, page after page, from a position. An iterator lives 15 minutes: an expired one is
  opened again just after the last record read. A position older than the stream's 24-hour retention starts over at
  the shard's oldest record, and the reader says after which record the gap begins (``gap_after``).
* ``raw_get_records``: boto3 turns ApproximateCreationDateTime into a datetime and binary values into bytes; capture,
  replay and the dead-letter queue want the wire JSON (base64 binary, epoch seconds), so the raw body is kept.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cleanup.aws.calls import call_or_gone
from cleanup.exceptions import IteratorExpiredError, StreamNotFoundError, TrimmedDataError
from cleanup.telemetry import log
from schemas.settings import StartPosition

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodbstreams import DynamoDBStreamsClient

EMPTY_READS_AT_END = 3
"""An open shard can answer empty before records that are there: this many empty reads in a row end a one-off read
to the end (``capture``, ``redrive``)."""
IDLE_AFTER_EMPTY_READS = 1
"""A consumer that keeps polling (the stream poller) counts a shard idle at its first empty read: whatever comes
later is read on its next poll (or by the next ``run --until-idle``, from the checkpoint)."""


@dataclass(frozen=True, slots=True)
class Shard:
    """One shard as DescribeStream lists it (``first``: its StartingSequenceNumber)."""

    shard_id: str
    parent_id: str | None
    closed: bool
    first: str | None = None


@dataclass(frozen=True, slots=True)
class Page:
    """One GetRecords answer: the records as sent, and the next iterator (None at the end of a closed shard)."""

    records: list[dict[str, Any]]
    next_iterator: str | None


def latest_stream_arn(dynamodb: DynamoDBClient, table: str) -> str:
    """The ARN of ``table``'s current stream.

    A stream that was disabled is still returned (with a warning): it holds its records for 24 hours more, and the
    REMOVEs among them still need cleaning.

    Raises:
        StreamNotFoundError: the table does not exist, or has no stream.
        TransientError / PermanentError: the table could not be described.
    """
    description = call_or_gone(
        dynamodb.describe_table, "DescribeTable", None, ("ResourceNotFoundException",), TableName=table
    )
    if description is None:
        raise StreamNotFoundError(f"table {table!r} does not exist")
    arn = description["Table"].get("LatestStreamArn")
    if not arn:
        raise StreamNotFoundError(
            f"table {table!r} has no stream enabled: enable one with StreamViewType NEW_AND_OLD_IMAGES"
        )
    if not description["Table"].get("StreamSpecification", {}).get("StreamEnabled"):
        log.warning("the table's stream is disabled: reading what it still holds", extra={"streamArn": arn})
    return str(arn)


def list_shards(streams: DynamoDBStreamsClient, stream_arn: str) -> list[Shard]:
    """Every shard of the stream (DescribeStream, every page).

    Raises:
        StreamNotFoundError: the stream does not exist (any more).
        TransientError / PermanentError: the stream could not be described.
    """
    shards: list[Shard] = []
    request: dict[str, Any] = {"StreamArn": stream_arn}
    while True:
        answer = call_or_gone(
            streams.describe_stream, "DescribeStream", None, ("ResourceNotFoundException",), **request
        )
        if answer is None:
            raise StreamNotFoundError(f"stream {stream_arn} does not exist")
        description = answer["StreamDescription"]
        for shard in description.get("Shards", []):
            numbers = shard.get("SequenceNumberRange", {})
            closed = "EndingSequenceNumber" in numbers
            shards.append(
                Shard(shard["ShardId"], shard.get("ParentShardId"), closed, numbers.get("StartingSequenceNumber"))
            )
        last = description.get("LastEvaluatedShardId")
        if not last:
            return shards
        request["ExclusiveStartShardId"] = last


def startable(shards: Iterable[Shard], finished: Collection[str], started: Collection[str]) -> list[Shard]:
    """The shards to start now: not finished, not started, and whose parent is finished, or no longer listed and
    not being read either (a parent that left the stream while its records were in hand is done with first)."""
    listed = {shard.shard_id for shard in shards}
    return [
        shard
        for shard in shards
        if shard.shard_id not in finished
        and shard.shard_id not in started
        and (
            shard.parent_id is None
            or shard.parent_id in finished
            or (shard.parent_id not in listed and shard.parent_id not in started)
        )
    ]


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
    request: dict[str, Any] = {"StreamArn": stream_arn, "ShardId": shard_id, "ShardIteratorType": str(start)}
    if after is not None:
        request.update(ShardIteratorType="AFTER_SEQUENCE_NUMBER", SequenceNumber=after)
    elif at is not None:
        request.update(ShardIteratorType="AT_SEQUENCE_NUMBER", SequenceNumber=at)
    answer = _stream_call(streams.get_shard_iterator, "GetShardIterator", **request)
    if answer is None:
        raise StreamNotFoundError(f"shard {shard_id} of {stream_arn} does not exist")
    return str(answer["ShardIterator"])


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
        start: StartPosition | str = StartPosition.TRIM_HORIZON,
        limit: int | None = None,
        empty_reads_at_end: int = EMPTY_READS_AT_END,
    ) -> None:
        self.streams, self.stream_arn, self.shard_id = streams, stream_arn, shard_id
        self.empty_reads_at_end = empty_reads_at_end
        self.last = after
        """The last record read (or the position to read after)."""
        self.ended = False
        """The end of a closed shard was reached."""
        self.empty_reads = 0
        self.gap_after: str | None = None
        """Set when the position was trimmed: the records after it, up to the next page's first, were lost."""
        self._at, self._start, self._limit = at, start, limit
        self._iterator: str | None = None

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
        return page

    def _open(self) -> str:
        try:
            if self.last is not None:
                return open_iterator(self.streams, self.stream_arn, self.shard_id, after=self.last)
            return open_iterator(self.streams, self.stream_arn, self.shard_id, at=self._at, start=self._start)
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
