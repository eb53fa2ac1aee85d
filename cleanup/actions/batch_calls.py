"""The requests the records of one batch share: live items read by table, scratch pages deleted by bucket.

One ``BatchCalls`` per batch (``cleanup.core.pipeline.process_batch`` asks the process for it): its coalescers
(``cleanup.aws.coalesce``) join the reads and deletions of the records being cleaned at the same moment into
BatchGetItem and DeleteObjects calls. Clients are asked for only when a request is sent, so a batch of bad records
makes no call at all. A DeleteObjects carries the
pages of at most ``BATCH_KEYS`` sessions: the permits of all of them are read in one BatchGetItem when it is sent.
"""

from __future__ import annotations

import threading
from typing import Any

from cleanup.actions import scratch
from cleanup.aws.coalesce import DELETE, READ, Batchmates, Coalescer, Part
from cleanup.aws.live_items import BATCH_KEYS, client_keys, read_live_items
from cleanup.core.fence import LiveRead
from cleanup.core.process import Configured
from cleanup.deadline import Deadline
from cleanup.exceptions import CleanupError
from schemas.session import Session

LiveReader = Coalescer[dict[str, Any], Session | None]
Answer = tuple[Session | None, float] | BaseException


class BatchCalls:
    """Coalescers for one batch, made on first use."""

    def __init__(self, runtime: Configured, mates: Batchmates | None = None) -> None:
        self.runtime = runtime
        self.mates = mates or Batchmates()
        self._lock = threading.Lock()
        self._readers: dict[str, LiveReader] = {}
        self._deleters: dict[str, scratch.Deleter] = {}

    def live(
        self, table: str, keys: dict[str, Any], deadline: Deadline, then: str | None = None
    ) -> tuple[Session | None, float]:
        """The item now stored under ``keys`` in ``table`` (a consistent read, batched), or None if there is none,
        and when its answer arrived.

        ``then``: the stage the calling thread heads to next (``cleanup.aws.coalesce``).

        Raises:
            TransientError / PermanentError: the read failed.
            BadRecordError: the live item's session attributes cannot be read (nothing may then be freed).
        """
        return self._reader(table).submit_timed(client_keys(keys), 1, deadline, then)

    def reader(self, table: str, keys: dict[str, Any]) -> LiveRead:
        """The fence's reader of the item under ``keys`` in ``table`` (``cleanup.core.fence.LiveRead``): ``live``, or
        ``read_now`` for several fences at once."""

        def read(deadline: Deadline, then: str | None) -> tuple[Session | None, float]:
            return self.live(table, keys, deadline, then)

        return LiveRead(table, keys, read, self.read_now)

    def read_now(self, table: str, all_keys: list[dict[str, Any]], deadline: Deadline) -> list[Answer]:
        """The items under ``all_keys`` in ``table``, read now on this thread (BatchGetItem, ``BATCH_KEYS`` a call):
        each one's answer and when it arrived, or its error."""
        parts: list[Part[dict[str, Any], Session | None]] = [Part(client_keys(keys), 1, deadline) for keys in all_keys]
        for start in range(0, len(parts), BATCH_KEYS):
            chunk = parts[start : start + BATCH_KEYS]
            try:
                self._read(table, chunk, deadline)
            except CleanupError as exc:
                for part in chunk:
                    part.fail(exc)
        return [part.error if part.error is not None else (part.result, part.at) for part in parts]

    def head(self, stage: str | None) -> None:
        """The calling thread's next stage (``cleanup.aws.coalesce.Batchmates.head``)."""
        self.mates.head(stage)

    def deleter(self, bucket: str) -> scratch.Deleter:
        """Where the records' scratch pages in ``bucket`` are deleted together."""
        with self._lock:
            deleter = self._deleters.get(bucket)
            if deleter is None:
                deleter = self._deleters[bucket] = Coalescer(
                    self.mates, DELETE, self._delete, scratch.PAGE, max_parts=BATCH_KEYS
                )
            return deleter

    def _reader(self, table: str) -> LiveReader:
        with self._lock:
            reader = self._readers.get(table)
            if reader is None:

                def read(parts: list[Part[dict[str, Any], Session | None]], deadline: Deadline) -> None:
                    self._read(table, parts, deadline)

                reader = self._readers[table] = Coalescer(self.mates, READ, read, BATCH_KEYS)
            return reader

    def _read(self, table: str, parts: list[Part[dict[str, Any], Session | None]], deadline: Deadline) -> None:
        runtime = self.runtime
        dynamodb, names = runtime.clients.dynamodb, runtime.settings.attributes
        read_live_items(dynamodb, table, parts, names, deadline, runtime.shape.extra)

    def _delete(self, parts: list[Part[scratch.Page, int]], deadline: Deadline) -> None:
        scratch.delete_pages(self.runtime.clients.s3, parts, deadline)
