"""What the stream poller does when records leave the stream before they are read: it says so, once, with the shard
and the range (``cleanup.streams.losses``), wherever the loss shows.

* A checkpoint older than the retention: the reader starts over at the shard's oldest record and names the gap
  (``ShardReader.gap_after``): lost, after the checkpoint and before the first record read.
* A shard read from its start with no checkpoint (a child shard, or START_POSITION=TRIM_HORIZON) answers no error
  when its head was trimmed: on its first read the first record's sequence number is compared with the shard's
  StartingSequenceNumber, and a first record past the start is confirmed with one GetShardIterator at the start,
  which a trimmed head refuses (TrimmedDataAccessException): lost, from the shard's start to the first record. A
  closed shard that yields nothing at all is asked the same.
* A shard that leaves the stream unfinished: every shard the poller starts is written to the checkpoint table first
  (a checkpoint item with no position), so one that vanishes before it is finished is always found: lost, after its
  checkpoint (or from its start).
* A stream that is gone: every unfinished checkpoint of it is reported lost, then forgotten.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cleanup.exceptions import CleanupError, StreamNotFoundError, TrimmedDataError
from cleanup.streams.losses import Loss, LossLedger
from cleanup.streams.reader import open_iterator
from cleanup.telemetry import log

if TYPE_CHECKING:
    from mypy_boto3_dynamodbstreams import DynamoDBStreamsClient

    from cleanup.runtime import Runtime
    from cleanup.streams.checkpointing import PollCheckpoints
    from cleanup.streams.shard_state import Cursor, PollSummary

TRIMMED = "trimmed from the stream (older than its retention) before they were read"
HEAD_TRIMMED = "the shard's first records were trimmed from the stream before they were read"
HEAD_UNCONFIRMED = "the shard's first records may have been trimmed (the service could not confirm: {error})"
VANISHED = "the shard left the stream (trimmed) before it was read to its end"
GONE = "the stream no longer exists"


class ShardLosses:
    """The losses of one stream's shards, reported through its ledger into the poller's summary."""

    def __init__(
        self,
        runtime: Runtime,
        stream_arn: str,
        streams: DynamoDBStreamsClient,
        checkpoints: PollCheckpoints,
        summary: PollSummary,
    ) -> None:
        self.runtime = runtime
        self.stream_arn = stream_arn
        self._streams = streams
        self._checkpoints = checkpoints
        self._summary = summary
        store = checkpoints.store
        self.ledger = LossLedger(store.dynamodb, store.table, stream_arn, lambda: checkpoints.writes)

    def report(self, shard_id: str, after: str | None, before: str | None, why: str) -> None:
        loss = Loss(shard_id, after, before, why)
        if self.ledger.report(self.runtime, loss):
            self._summary.lost.append({"shardId": shard_id, "after": after, "before": before})

    def forget_vanished(self, listed: set[str], reading: set[str]) -> None:
        """The checkpoints of shards no longer listed: an unfinished one's records are lost; each is forgotten."""
        for shard_id, saved in list(self._checkpoints.saved.items()):
            if shard_id in listed or shard_id in reading:
                continue  # a shard still being read is done with when its reading ends
            if not saved.finished:
                self.report(shard_id, saved.sequence_number, None, VANISHED)
            if not self._checkpoints.forget(shard_id):
                return  # stopping: the next consumer forgets it (the ledger keeps it from being reported twice)

    def stream_gone(self, reading: dict[str, str | None]) -> None:
        """The stream is gone (a day after it was disabled): whatever its shards held past their checkpoints (and
        past the positions of the shards being read, ``reading``) is lost; then its checkpoints are forgotten, so
        that no later run reports them again."""
        log.error("the stream no longer exists", extra={"streamArn": self.stream_arn})
        unfinished = {shard: c.sequence_number for shard, c in self._checkpoints.saved.items() if not c.finished}
        unfinished.update(reading)
        for shard_id, after in unfinished.items():
            self.report(shard_id, after, None, GONE)
        for shard_id in list(self._checkpoints.saved):
            if not self._checkpoints.forget(shard_id):
                return

    def check_head(self, cursor: Cursor, records: list[dict[str, Any]]) -> None:
        """On a shard's first read from its start: were its first records trimmed before this read?"""
        start, cursor.head = cursor.head, None
        first = str(records[0]["dynamodb"]["SequenceNumber"]) if records else None
        if start is None or (first is not None and not _after(first, start)):
            return
        try:
            open_iterator(self._streams, self.stream_arn, cursor.shard_id, at=start)
        except TrimmedDataError:
            self.report(cursor.shard_id, None, first, HEAD_TRIMMED)
        except StreamNotFoundError:
            raise
        except CleanupError as exc:  # unknown is not "nothing lost": said, as unconfirmed
            self.report(cursor.shard_id, None, first, HEAD_UNCONFIRMED.format(error=exc))
        else:
            log.info(
                "the shard's first record follows its start: nothing trimmed",
                extra={"shardId": cursor.shard_id, "start": start, "first": first},
            )


def _after(first: str, start: str) -> bool:
    """Whether sequence number ``first`` lies past ``start`` (compared as integers; unreadable ones: unknown, so
    asked)."""
    try:
        return int(first) > int(start)
    except ValueError:
        return True
