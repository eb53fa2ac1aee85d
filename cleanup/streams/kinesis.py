"""Reading a range of one shard of a Kinesis data stream (a Kinesis mapping's failed batch, for redrive).

The range is read from its first sequence number (GetShardIterator AT_SEQUENCE_NUMBER) with GetRecords, page after
page, until a record at or past its last sequence number (compared as integers), the end of a closed shard, or the
stream's tip: ``EMPTY_READS_AT_END`` empty pages in a row with nothing behind them (``MillisBehindLatest`` 0). An empty
page while the shard still has records behind it (a stretch with no records) does not count. An iterator that expired
(five minutes) is opened again just after the last record read. Records come back as GetRecords returns them
(``Data`` already decoded from base64 by botocore).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cleanup.aws.answers import needed
from cleanup.aws.calls import call_or_gone
from cleanup.exceptions import IteratorExpiredError, StreamNotFoundError
from cleanup.streams.reader import EMPTY_READS_AT_END

if TYPE_CHECKING:
    from mypy_boto3_kinesis import KinesisClient
    from mypy_boto3_kinesis.literals import ShardIteratorTypeType

PAGE = 1000  # records per GetRecords: a failed batch is at most 10,000 records


def read_shard_range(
    kinesis: KinesisClient, stream_arn: str, shard_id: str, start: str, end: str
) -> list[dict[str, Any]]:
    """The records of ``shard_id`` from ``start`` to ``end`` (inclusive) that the stream still holds.

    Raises:
        StreamNotFoundError: the stream or the shard does not exist (any more).
        TransientError / PermanentError: the stream could not be read (or answered a record without its number).
    """
    first, last = int(start), int(end)
    found: list[dict[str, Any]] = []
    iterator: str | None = _open(kinesis, stream_arn, shard_id, "AT_SEQUENCE_NUMBER", start)
    read_to: str | None = None
    empty = 0
    while iterator is not None and empty < EMPTY_READS_AT_END:
        try:
            page = _read(kinesis, stream_arn, iterator)
        except IteratorExpiredError:
            if read_to:
                iterator = _open(kinesis, stream_arn, shard_id, "AFTER_SEQUENCE_NUMBER", read_to)
            else:
                iterator = _open(kinesis, stream_arn, shard_id, "AT_SEQUENCE_NUMBER", start)
            continue
        records = page.get("Records", [])
        numbers = [int(needed(record, "GetRecords", "SequenceNumber", kind=str)) for record in records]
        found += [record for record, number in zip(records, numbers, strict=True) if first <= number <= last]
        if any(number >= last for number in numbers):
            break
        if records:
            read_to = str(numbers[-1])
        caught_up = not records and not page.get("MillisBehindLatest")
        empty = empty + 1 if caught_up else 0
        iterator = page.get("NextShardIterator")  # None at the end of a closed shard
    return found


def _open(
    kinesis: KinesisClient, stream_arn: str, shard_id: str, kind: ShardIteratorTypeType, sequence_number: str
) -> str:
    answer = call_or_gone(
        kinesis.get_shard_iterator,
        "GetShardIterator",
        None,
        ("ResourceNotFoundException",),
        StreamARN=stream_arn,
        ShardId=shard_id,
        ShardIteratorType=kind,
        StartingSequenceNumber=sequence_number,
    )
    if answer is None:
        raise StreamNotFoundError(f"shard {shard_id} of {stream_arn} does not exist")
    return str(needed(answer, "GetShardIterator", "ShardIterator", kind=str))


def _read(kinesis: KinesisClient, stream_arn: str, iterator: str) -> dict[str, Any]:
    answer = call_or_gone(
        kinesis.get_records,
        "GetRecords",
        None,
        ("ResourceNotFoundException",),
        StreamARN=stream_arn,
        ShardIterator=iterator,
        Limit=PAGE,
    )
    if answer is None:
        raise StreamNotFoundError(f"stream {stream_arn} does not exist")
    return dict(answer)
