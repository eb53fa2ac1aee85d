"""Finding a table's stream and its shards, and which shards may be read now.

* ``latest_stream_arn`` / ``table_stream``: a table's current stream. Disabling a stream and enabling it again (how a
  table changes its view type) makes a new stream with a new ARN; the old one keeps its records for 24 hours, its
  shards closed, and is then gone.
* ``list_shards`` and ``startable``: DynamoDB Streams splits a shard about every four hours: the parent closes (its
  SequenceNumberRange gets an EndingSequenceNumber) and children name it in ParentShardId. Records of one item move
  from the parent to a child, so a child may only be read once its parent is finished, or they would be handled out
  of order.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cleanup.aws.answers import needed
from cleanup.aws.calls import call_or_gone
from cleanup.exceptions import StreamNotFoundError
from cleanup.telemetry import log

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodbstreams import DynamoDBStreamsClient


@dataclass(frozen=True, slots=True)
class Shard:
    """One shard as DescribeStream lists it (``first``: its StartingSequenceNumber)."""

    shard_id: str
    parent_id: str | None
    closed: bool
    first: str | None = None


def latest_stream_arn(dynamodb: DynamoDBClient, table: str) -> str:
    """The ARN of ``table``'s current stream.

    A stream that was disabled is still returned (with a warning): it holds its records for 24 hours more, and the
    REMOVEs among them still need cleaning.

    Raises:
        StreamNotFoundError: the table does not exist, or has no stream.
        TransientError / PermanentError: the table could not be described.
    """
    arn, enabled = table_stream(dynamodb, table)
    if not enabled:
        log.warning("the table's stream is disabled: reading what it still holds", extra={"streamArn": arn})
    return arn


def table_stream(dynamodb: DynamoDBClient, table: str) -> tuple[str, bool]:
    """The ARN of ``table``'s current stream, and whether it is enabled (raises as ``latest_stream_arn``)."""
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
    return str(arn), bool(description["Table"].get("StreamSpecification", {}).get("StreamEnabled"))


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
        description = needed(answer, "DescribeStream", "StreamDescription", kind=dict)
        for shard in description.get("Shards", []):
            numbers = shard.get("SequenceNumberRange", {})
            closed = "EndingSequenceNumber" in numbers
            shards.append(
                Shard(
                    needed(shard, "DescribeStream", "ShardId", kind=str),
                    shard.get("ParentShardId"),
                    closed,
                    numbers.get("StartingSequenceNumber"),
                )
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
