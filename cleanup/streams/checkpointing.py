"""The stream poller's checkpoints: which are written, writing them, and calling the table through its failures.

The checkpoint table may throttle or fail for a while: the poller then waits (the consumers' ``Backoff``) and tries
again; it never crashes on it. A checkpoint left unwritten only means records are read again, never lost. A
permanent error (``CheckpointTableError``, e.g. a missing permission) is not retried: it ends the command.

A dry run reads the checkpoints (it starts where an enforce run would) and writes or deletes none: the consumer moves
on in memory only, and the next enforce run starts from the same place. Where shards start at LATEST, a dry run keeps
the pins it reads from apart (``cleanup.streams.previews``), and every consumer reads them with the checkpoints.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception_type

from cleanup.aws.retry import call_with_retry
from cleanup.deadline import Deadline
from cleanup.exceptions import StopRequested, TransientError
from cleanup.streams.checkpoints import Checkpoint, CheckpointStore
from cleanup.streams.previews import PreviewPins
from cleanup.streams.retry_in_place import Backoff, may_move_past
from cleanup.telemetry import log
from schemas.settings import Settings

T = TypeVar("T")


class PollCheckpoints:
    """One stream's checkpoints, as far as this consumer knows them (``saved``: what the table holds)."""

    def __init__(
        self,
        store: CheckpointStore,
        settings: Settings,
        stopping: threading.Event,
        wait: Callable[[float], None],
        *,
        latest: bool = False,
    ) -> None:
        """``wait`` sleeps (returning early once ``stopping`` is set), keeping the lease while it does; ``latest``:
        shards without a checkpoint start at LATEST, so the dry runs' pins are read (and kept, in a dry run)."""
        self.store = store
        self.saved: dict[str, Checkpoint] = {}
        self.previews = PreviewPins(store.dynamodb, store.table, store.stream_arn)
        self.latest = latest
        self.keeps_previews = False
        """A dry run at LATEST keeps its pins once it knows the checkpoint table exists (it creates none)."""
        self._settings = settings
        self._stopping = stopping
        self._wait = wait
        self._backoff = Backoff(settings)
        self.writes = may_move_past(settings)
        """Whether checkpoints are written (never in a dry run, from CLEANUP_MODE or the kill switch)."""

    def persist(self, operation: str, call: Callable[[], T]) -> T:
        """Call the checkpoint table until it answers; throttling and server errors back off and are tried again.

        Raises:
            StopRequested: asked to stop before it answered.
            CheckpointTableError: a permanent error, not retried.
        """

        def failed(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            extra = {"operation": operation, "error": str(error), "attempt": state.attempt_number}
            log.warning("checkpoint table call failed; backing off", extra=extra)

        retrying = Retrying(
            retry=retry_if_exception_type(TransientError),
            stop=lambda _state: self._stopping.is_set(),
            wait=self._backoff,
            sleep=self._wait,
            before_sleep=failed,
            reraise=True,
        )
        try:
            return retrying(call)
        except TransientError as exc:
            raise StopRequested(operation) from exc

    def load(self) -> dict[str, Checkpoint]:
        """Read every shard's checkpoint (and, at LATEST, the dry runs' pins), waiting for the table as long as it
        fails (raises as ``persist``)."""
        self.saved = self.persist("Query", self.store.load)
        if self.latest:
            self.persist("Query", self.previews.load)
        return self.saved

    def save(self, shard_id: str, checkpoint: Checkpoint, *, strict: bool = False) -> bool:
        """Write a checkpoint; False if it stays unwritten (logged: the next one carries it).

        Raises:
            TransientError: with ``strict``, instead of returning False.
        """
        if not self.writes:
            return False
        try:
            call_with_retry(lambda: self.store.save(shard_id, checkpoint), self._settings, Deadline())
        except TransientError as exc:
            if strict:
                raise
            log.warning(
                "checkpoint not written; the next one carries it", extra={"shardId": shard_id, "error": str(exc)}
            )
            return False
        self.saved[shard_id] = checkpoint
        return True

    def save_last(self, positions: Iterable[tuple[str, str | None]]) -> None:
        """On the way out, each shard's (id, clean-through) position not written yet: one that cannot be written is
        logged, and its records after the last checkpoint are read again by the next consumer."""
        if not self.writes:
            log.info("dry run: no checkpoint written; the next run starts where this one did")
            return
        for shard_id, position in positions:
            saved = self.saved.get(shard_id)
            if position is None or (saved is not None and saved.sequence_number == position):
                continue  # written already (a LATEST start's pin at it, too: kept)
            if not self.save(shard_id, Checkpoint(position)):
                log.warning(
                    "last checkpoint not written: the records after the last one written will be read again",
                    extra={"shardId": shard_id, "checkpoint": saved.sequence_number if saved else None},
                )

    def forget(self, shard_id: str) -> bool:
        """Delete a vanished shard's checkpoint, waiting for the table as long as it fails; False if stopped first."""
        if not self.writes:
            del self.saved[shard_id]  # kept in the table, for the enforce run to report and delete
            return True
        try:
            self.persist("TransactWriteItems", lambda: self.store.forget(shard_id))
        except StopRequested:
            return False
        del self.saved[shard_id]
        return True
