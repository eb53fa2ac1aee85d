"""Following a table's stream (``cleanup-worker run --table-name``): the table's current stream, then the next one.

Disabling a table's stream and enabling it again (how a table changes its view type) makes a new stream, with a new
ARN; the old one keeps its records for 24 hours, every shard closed, and is then gone. The poller reads the old
stream to its end (or until it is gone, counting what it could not read as lost), then the follower looks up the
table's current stream and reads the new one from its start (TRIM_HORIZON), logging the change. While the table
names no other stream, the follower looks again every SHARD_DISCOVERY_SECONDS, and the health check says why the
poller is unhealthy (``cleanup.streams.stream_state``): it cleans nothing meanwhile.

A follower that starts (a restart, a deployment, a crash at the change) first reads every earlier stream of the table
that has unfinished checkpoints, oldest first (``cleanup.streams.lineup``), each under its own lease: to its end, or,
if it is gone, reporting its unfinished checkpoints lost once and forgetting them. Only then the table's latest stream,
from its start. A standby stands by on the lease of the oldest such stream.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from cleanup.exceptions import StreamNotFoundError, TransientError
from cleanup.runtime import Runtime
from cleanup.streams.checkpoint_table import table_exists
from cleanup.streams.discovery import table_stream
from cleanup.streams.lineup import unfinished_streams
from cleanup.streams.poller import StreamPoller
from cleanup.streams.shard_state import PollSummary
from cleanup.streams.stream_state import StreamState
from cleanup.telemetry import log
from schemas.settings import StartPosition

if TYPE_CHECKING:
    from mypy_boto3_dynamodbstreams import DynamoDBStreamsClient


class StreamFollower:
    """Consumes ``stream_arn``, then, once it has ended, the next stream of ``table`` (none followed without one)."""

    def __init__(
        self,
        runtime: Runtime,
        stream_arn: str,
        *,
        table: str | None = None,
        consumer_id: str | None = None,
        streams: DynamoDBStreamsClient | None = None,
    ) -> None:
        self.runtime = runtime
        self.stream_arn = stream_arn
        self.table = table
        self.summary = PollSummary()
        self._consumer_id = consumer_id
        self._streams = streams
        self._state = StreamState(runtime.settings.health_file)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._poller: StreamPoller | None = None

    def request_stop(self) -> None:
        """Stop after the batch in flight (safe from a signal handler)."""
        self._stopping.set()
        with self._lock:
            poller = self._poller
        if poller is not None:
            poller.request_stop()

    def run(self, *, until_idle: bool = False) -> PollSummary:
        """Consume stream after stream until stopped (with ``until_idle``: until drained, or no new stream).

        Raises:
            CheckpointTableError: as ``StreamPoller.run``.
        """
        start: StartPosition | None = None  # START_POSITION for the first stream; a new one is read from its start
        try:
            latest = self.stream_arn
            for earlier in self._earlier_streams():
                self.stream_arn = earlier
                if not self._consume(StartPosition.TRIM_HORIZON, until_idle):
                    return self.summary  # not read to its end: the later streams' records follow its own
                start = StartPosition.TRIM_HORIZON
            self.stream_arn = latest
            while not self._stopping.is_set() and self._consume(start, until_idle):
                following = self._next_stream(until_idle)
                if following is None:
                    break
                extra = {"table": self.table, "fromStream": self.stream_arn, "toStream": following}
                log.warning("following the table's new stream", extra=extra)
                self.stream_arn, start = following, StartPosition.TRIM_HORIZON
        finally:
            self._state.clear()
        return self.summary

    def _earlier_streams(self) -> list[str]:
        """The table's earlier streams with unfinished checkpoints, oldest first (none without a table, or with no
        checkpoint table yet); the checkpoint table is asked until it answers, or the follower is stopped.

        Raises:
            CheckpointTableError: the table refuses the worker (e.g. ``dynamodb:Scan`` not granted).
        """
        if self.table is None:
            return []
        dynamodb, table = self.runtime.clients.dynamodb, self.runtime.settings.checkpoint_table
        while not self._stopping.is_set():
            try:
                if not table_exists(dynamodb, table):
                    return []
                earlier = unfinished_streams(dynamodb, table, self.stream_arn)
            except TransientError as exc:
                log.warning("cannot read the checkpoint table; will look again", extra={"error": str(exc)})
                self._stopping.wait(self.runtime.settings.shard_discovery_seconds)
                continue
            for arn, shards in earlier.items():
                extra = {"table": self.table, "streamArn": arn, "unfinishedShards": shards, "latest": self.stream_arn}
                log.warning("an earlier stream of the table has unfinished checkpoints: reading it first", extra=extra)
            return list(earlier)
        return []

    def _consume(self, start: StartPosition | None, until_idle: bool) -> bool:
        """Run a poller on the current stream; True when the stream has ended."""
        poller = StreamPoller(
            self.runtime, self.stream_arn, consumer_id=self._consumer_id, streams=self._streams, start_position=start
        )
        with self._lock:
            self._poller = poller
        if self._stopping.is_set():
            return False
        self._state.clear()
        summary = poller.run(until_idle=until_idle)
        self.summary.add(summary)
        return summary.stream_ended

    def _next_stream(self, until_idle: bool) -> str | None:
        """The table's next stream once it names one; None when stopped, without a table, or at once with
        ``until_idle``."""
        said = False
        while self.table is not None:
            try:
                arn, _enabled = table_stream(self.runtime.clients.dynamodb, self.table)
                if arn != self.stream_arn:
                    return arn
                problem = self._problem(f"table {self.table} names no other stream")
            except StreamNotFoundError as exc:
                problem = self._problem(str(exc))
            except TransientError as exc:
                log.warning("cannot describe the table; will look again", extra={"error": str(exc)})
                problem = None
            if problem is not None:
                self._state.problem(problem)
                if not said:
                    log.error(problem, extra={"streamArn": self.stream_arn, "table": self.table})
                    said = True
            if until_idle or self._stopping.wait(self.runtime.settings.shard_discovery_seconds):
                return None
        return None

    def _problem(self, why_not: str) -> str:
        if self.summary.stream_gone:
            ended = f"stream {self.stream_arn} no longer exists"
        else:
            ended = f"stream {self.stream_arn} is disabled: every shard is closed and read"
        return f"{ended}, and {why_not}: nothing is cleaned until the table's stream is enabled again"
