"""A stand-in DynamoDB Streams client for what moto cannot do: trim a shard, split one, close one, or keep a table's
old stream readable (or make it gone) beside its new one.

Its records are ones moto wrote (REMOVEs of real sessions in moto, read back with GetRecords), so the worker's cleaning
is observed in moto as always: only where the records come from is stood in for. It answers the calls the worker
makes (DescribeStream, GetShardIterator, GetRecords) as DynamoDB Streams documents them:

* a shard's ``StartingSequenceNumber`` is its first record's; records before ``trimmed`` are gone: TRIM_HORIZON
  starts after them, AT/AFTER_SEQUENCE_NUMBER on one of them answers TrimmedDataAccessException;
* a closed shard has an ``EndingSequenceNumber``, and its last page no NextShardIterator;
* a stream that is ``gone`` answers ResourceNotFoundException to everything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from botocore.exceptions import ClientError


def error(code: str, operation: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}}, operation)


@dataclass
class Shard:
    shard_id: str
    records: list[dict[str, Any]]
    parent: str | None = None
    closed: bool = False
    trimmed: int = 0
    """Records before this index were trimmed (older than the retention)."""
    start: str | None = None
    """The shard's StartingSequenceNumber, when it is not its first record's."""

    def numbers(self) -> list[int]:
        return [int(record["dynamodb"]["SequenceNumber"]) for record in self.records]

    def description(self) -> dict[str, Any]:
        numbers = self.numbers()
        first = self.start or (str(numbers[0]) if numbers else "1")
        sequence_range: dict[str, str] = {"StartingSequenceNumber": first}
        if self.closed:
            sequence_range["EndingSequenceNumber"] = str(numbers[-1]) if numbers else first
        description: dict[str, Any] = {"ShardId": self.shard_id, "SequenceNumberRange": sequence_range}
        if self.parent:
            description["ParentShardId"] = self.parent
        return description


@dataclass
class StandInStreams:
    """Streams of one table, by ARN, each a list of shards; ``reads`` logs every GetRecords (stream, shard)."""

    table: str
    streams: dict[str, list[Shard]] = field(default_factory=dict)
    gone: set[str] = field(default_factory=set)
    reads: list[tuple[str, str]] = field(default_factory=list)
    iterators: list[tuple[str, str, str]] = field(default_factory=list)
    """Every GetShardIterator: (shard, type, sequence number)."""

    def __post_init__(self) -> None:
        self._handlers: dict[str, Any] = {}
        self.meta = SimpleNamespace(events=self)

    def register(self, event: str, handler: Any, unique_id: str | None = None) -> None:
        self._handlers[event] = handler

    def shard(self, stream_arn: str, shard_id: str) -> Shard:
        if stream_arn in self.gone:
            raise error("ResourceNotFoundException", "GetShardIterator")
        found = [s for s in self.streams.get(stream_arn, []) if s.shard_id == shard_id]
        if not found:
            raise error("ResourceNotFoundException", "GetShardIterator")
        return found[0]

    # The calls.
    def describe_stream(self, StreamArn: str, **_: Any) -> dict[str, Any]:
        if StreamArn in self.gone or StreamArn not in self.streams:
            raise error("ResourceNotFoundException", "DescribeStream")
        shards = [s.description() for s in self.streams[StreamArn] if s.trimmed < len(s.records) or not s.closed]
        return {"StreamDescription": {"StreamArn": StreamArn, "Shards": shards}}

    def get_shard_iterator(
        self, StreamArn: str, ShardId: str, ShardIteratorType: str, SequenceNumber: str = "", **_: Any
    ) -> dict[str, Any]:
        shard = self.shard(StreamArn, ShardId)
        self.iterators.append((ShardId, ShardIteratorType, SequenceNumber))
        numbers = shard.numbers()
        if ShardIteratorType == "TRIM_HORIZON":
            position = shard.trimmed
        elif ShardIteratorType == "LATEST":
            position = len(numbers)
        else:
            wanted = int(SequenceNumber)
            if ShardIteratorType == "AFTER_SEQUENCE_NUMBER":
                wanted += 1
            position = next((n for n, number in enumerate(numbers) if number >= wanted), len(numbers))
            if position < shard.trimmed:
                raise error("TrimmedDataAccessException", "GetShardIterator")
        return {"ShardIterator": f"{StreamArn}|{ShardId}|{position}"}

    def get_records(self, ShardIterator: str, Limit: int = 1000) -> dict[str, Any]:
        stream_arn, shard_id, position_text = ShardIterator.split("|")
        shard = self.shard(stream_arn, shard_id)
        position = int(position_text)
        records = shard.records[position : position + Limit]
        end = position + len(records)
        body: dict[str, Any] = {"Records": records}
        if not shard.closed or end < len(shard.records):
            body["NextShardIterator"] = f"{stream_arn}|{shard_id}|{end}"
        self.reads.append((stream_arn, shard_id))
        self._handlers["after-call.dynamodbstreams.GetRecords"](
            http_response=SimpleNamespace(content=json.dumps(body).encode())
        )
        return body
