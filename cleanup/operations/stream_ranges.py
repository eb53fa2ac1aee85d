"""Reading a failed batch's range again from its stream: a DynamoDB stream's shard, or a Kinesis data stream's.

A Lambda on-failure message names a stream, a shard and the first and last sequence numbers of a failed invocation
(``BatchRange``). The records still in the stream are read again, compared as integers, and those it no longer
holds (trimmed after its retention, or the stream deleted) are reported lost (``Lost``). Redrive
(``cleanup.operations.redrive``) cleans what is read through the core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cleanup.aws.answers import needed
from cleanup.exceptions import StreamNotFoundError
from cleanup.streams.kinesis import read_shard_range
from cleanup.streams.reader import ShardReader, list_shards
from schemas.records import Source, read_kinesis_bytes, read_record, sequence_number_of

if TYPE_CHECKING:
    from mypy_boto3_dynamodbstreams import DynamoDBStreamsClient
    from mypy_boto3_kinesis import KinesisClient

    from cleanup.core.pipeline import Incoming


@dataclass(frozen=True, slots=True)
class BatchRange:
    """``DDBStreamBatchInfo`` (or ``KinesisBatchInfo``, ``kinesis``): the records of one failed invocation."""

    stream_arn: str
    shard_id: str
    start: str
    end: str
    size: int | None = None
    kinesis: bool = False


@dataclass(frozen=True, slots=True)
class Lost:
    """Records of a range the stream no longer holds: ``first`` to ``last`` (inclusive), and why."""

    first: str
    last: str
    why: str


def read_range(streams: DynamoDBStreamsClient, batch: BatchRange) -> tuple[list[Incoming], list[Lost], int]:
    """The records of ``batch`` still in the stream, the ranges that are not, and how many records are missing.

    The range is read from ``startSequenceNumber`` (or the shard's first record, if later) up to
    ``endSequenceNumber``, compared as integers; a start the stream no longer holds reads what is left of the shard.

    Raises:
        TransientError / PermanentError: the stream could not be read (other than being gone).
    """
    start, end = int(batch.start), int(batch.end)
    try:
        shard = next((s for s in list_shards(streams, batch.stream_arn) if s.shard_id == batch.shard_id), None)
        if shard is None:
            raise StreamNotFoundError(f"shard {batch.shard_id} is no longer in {batch.stream_arn}")
        at = str(max(start, int(shard.first or 0)))
        found = _read_to(ShardReader(streams, batch.stream_arn, batch.shard_id, at=at), start, end)
    except StreamNotFoundError:
        return [], [Lost(batch.start, batch.end, "the stream or its shard no longer exists")], batch.size or 0
    # Lambda records name their stream; so do these, so that the core knows their table.
    records = [read_record({**raw, "eventSourceARN": batch.stream_arn}, Source.LAMBDA) for raw in found]
    lost = _lost(batch, [int(sequence_number_of(raw) or 0) for raw in found])
    missing = max(0, batch.size - len(found)) if batch.size else 0
    return records, lost, missing


def read_kinesis_range(kinesis: KinesisClient, batch: BatchRange) -> tuple[list[Incoming], list[Lost], int]:
    """``read_range`` for a Kinesis data stream: each record's data decoded into the DynamoDB change it carries.

    Raises:
        TransientError / PermanentError: the stream could not be read (other than being gone).
    """
    try:
        found = read_shard_range(kinesis, batch.stream_arn, batch.shard_id, batch.start, batch.end)
    except StreamNotFoundError:
        return [], [Lost(batch.start, batch.end, "the stream or its shard no longer exists")], batch.size or 0
    records = [read_kinesis_bytes(needed(raw, "GetRecords", "Data"), str(raw["SequenceNumber"])) for raw in found]
    lost = _lost(batch, [int(raw["SequenceNumber"]) for raw in found])  # each one read by read_shard_range
    missing = max(0, batch.size - len(found)) if batch.size else 0
    return records, lost, missing


def _read_to(reader: ShardReader, start: int, end: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    while not reader.drained:
        numbers = [(int(sequence_number_of(raw) or 0), raw) for raw in reader.read().records]
        found += [raw for number, raw in numbers if start <= number <= end]
        if any(number >= end for number, _ in numbers):
            break
    return found


def _lost(batch: BatchRange, numbers: list[int]) -> list[Lost]:
    start, end = int(batch.start), int(batch.end)
    if not numbers:
        return [Lost(batch.start, batch.end, "no longer in the stream (trimmed)")]
    lost = []
    if numbers[0] != start:
        lost.append(Lost(batch.start, str(numbers[0] - 1), "no longer in the stream (trimmed)"))
    if numbers[-1] != end:
        lost.append(Lost(str(numbers[-1] + 1), batch.end, "not found in the stream"))
    return lost
