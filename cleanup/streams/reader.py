"""A DynamoDB stream's shards: discovery, lineage, and reading one shard from a position.

DynamoDB Streams splits a shard about every four hours: the parent closes (its SequenceNumberRange gets an
EndingSequenceNumber) and children name it in ParentShardId. Records of one item move from the parent to a child, so
a child may only be read once its parent is finished, or they would be cleaned out of order.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from cleanup.aws_errors import error_code, translate
from cleanup.exceptions import IteratorExpiredError, TrimmedDataError
from schemas.settings import StartPosition


@dataclass(frozen=True, slots=True)
class Shard:
    """One shard as DescribeStream lists it."""

    shard_id: str
    parent_id: str | None
    closed: bool


@dataclass(frozen=True, slots=True)
class Page:
    """One GetRecords answer: the records as sent, and the next iterator (None at the end of a closed shard)."""

    records: list[dict[str, Any]]
    next_iterator: str | None


def describe_shards(streams: Any, stream_arn: str) -> list[Shard]:
    """Every shard of the stream (DescribeStream, paged)."""
    shards: list[Shard] = []
    kwargs: dict[str, Any] = {"StreamArn": stream_arn}
    while True:
        description = _call("DescribeStream", streams.describe_stream, **kwargs)["StreamDescription"]
        for shard in description.get("Shards", []):
            closed = "EndingSequenceNumber" in shard.get("SequenceNumberRange", {})
            shards.append(Shard(shard["ShardId"], shard.get("ParentShardId"), closed))
        last = description.get("LastEvaluatedShardId")
        if not last:
            return shards
        kwargs["ExclusiveStartShardId"] = last


def startable(shards: Iterable[Shard], finished: Collection[str], started: Collection[str]) -> list[Shard]:
    """The shards to start now: not finished, not started, and whose parent is finished or no longer listed."""
    listed = {shard.shard_id for shard in shards}
    return [
        shard
        for shard in shards
        if shard.shard_id not in finished
        and shard.shard_id not in started
        and (shard.parent_id is None or shard.parent_id in finished or shard.parent_id not in listed)
    ]


def shard_iterator(streams: Any, stream_arn: str, shard_id: str, after: str | None, start: StartPosition | str) -> str:
    """An iterator just after ``after`` (the checkpoint), or at ``start`` when the shard has none.

    Raises:
        TrimmedDataError: ``after`` is older than the stream's retention.
        TransientError: throttling or a server error.
        PermanentError: the stream or shard does not exist, or access is denied.
    """
    kwargs: dict[str, Any] = {"StreamArn": stream_arn, "ShardId": shard_id, "ShardIteratorType": str(start)}
    if after is not None:
        kwargs.update(ShardIteratorType="AFTER_SEQUENCE_NUMBER", SequenceNumber=after)
    return str(_call("GetShardIterator", streams.get_shard_iterator, **kwargs)["ShardIterator"])


def read_page(streams: Any, iterator: str, limit: int) -> Page:
    """One GetRecords call, the records kept as the service sent them.

    Raises:
        IteratorExpiredError: the iterator is older than 15 minutes.
        TrimmedDataError: the iterator points before the stream's retention.
        TransientError: throttling (LimitExceededException) or a server error.
        PermanentError: anything else.
    """
    response = _call("GetRecords", raw_get_records, streams, iterator, limit)
    return Page(list(response.get("Records", [])), response.get("NextShardIterator"))


def _call(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except ClientError as exc:
        code = error_code(exc)
        if code == "ExpiredIteratorException":
            raise IteratorExpiredError(f"{what}: {code}") from exc
        if code == "TrimmedDataAccessException":
            raise TrimmedDataError(f"{what}: {code}") from exc
        raise translate(exc, what) from exc
    except BotoCoreError as exc:
        raise translate(exc, what) from exc


# Reading losslessly: boto3 turns ApproximateCreationDateTime into a datetime and binary values into bytes. Capture,
# replay and the dead-letter queue want the wire JSON (base64 binary, epoch seconds), so the raw body is kept.
_local = threading.local()


def _keep_body(http_response: Any, **_: Any) -> None:
    _local.body = http_response.content


def raw_get_records(streams: Any, shard_iterator: str, limit: int | None = None) -> dict[str, Any]:
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
