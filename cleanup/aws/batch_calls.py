"""The requests the records of one batch share: live items read by table, scratch pages deleted by bucket.

One ``BatchCalls`` per batch (``pipeline.process_batch``): its coalescers (``cleanup.aws.coalesce``) join the reads and
deletions of the records being cleaned at the same moment into BatchGetItem and DeleteObjects calls. Clients are
asked for only when a request is sent, so a batch of bad records makes no call at all.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from cleanup.actions import scratch
from cleanup.aws.coalesce import DELETE, READ, Batchmates, Coalescer, Part
from cleanup.aws.retry import Deadline
from cleanup.core.race import BATCH_KEYS, client_keys, read_live_items
from cleanup.runtime import Runtime
from schemas.session import Session

LiveReader = Coalescer[dict[str, Any], Session | None]


class BatchCalls:
    """Coalescers for one batch, made on first use."""

    def __init__(self, runtime: Runtime, mates: Batchmates | None = None) -> None:
        self.runtime = runtime
        self.mates = mates or Batchmates()
        self._lock = threading.Lock()
        self._readers: dict[str, LiveReader] = {}
        self._deleters: dict[str, scratch.Deleter] = {}

    def live(self, table: str, keys: dict[str, Any], deadline: Deadline, then: str | None = None) -> Session | None:
        """The item now stored under ``keys`` in ``table`` (a consistent read, batched), or None if there is none.

        ``then``: the stage the calling thread heads to next (``cleanup.aws.coalesce``).

        Raises:
            TransientError / PermanentError: the read failed.
            BadRecordError: the live item's session attributes cannot be read (nothing may then be freed).
        """
        return self._reader(table).submit(client_keys(keys), 1, deadline, then)

    def reader(self, table: str, keys: dict[str, Any]) -> Callable[[Deadline, str | None], Session | None]:
        """The fence's reader of the item under ``keys`` in ``table`` (``cleanup.core.fence.Reader``): ``live``."""

        def read(deadline: Deadline, then: str | None) -> Session | None:
            return self.live(table, keys, deadline, then)

        return read

    def deleter(self, bucket: str) -> scratch.Deleter:
        """Where the records' scratch pages in ``bucket`` are deleted together."""
        with self._lock:
            deleter = self._deleters.get(bucket)
            if deleter is None:
                deleter = self._deleters[bucket] = Coalescer(self.mates, DELETE, self._delete, scratch.PAGE)
            return deleter

    def _reader(self, table: str) -> LiveReader:
        with self._lock:
            reader = self._readers.get(table)
            if reader is None:

                def read(parts: list[Part[dict[str, Any], Session | None]], deadline: Deadline) -> None:
                    dynamodb = self.runtime.clients.dynamodb
                    read_live_items(dynamodb, table, parts, self.runtime.settings.attributes, deadline)

                reader = self._readers[table] = Coalescer(self.mates, READ, read, BATCH_KEYS)
            return reader

    def _delete(self, parts: list[Part[scratch.Page, int]], deadline: Deadline) -> None:
        scratch.delete_pages(self.runtime.clients.s3, parts, deadline)
