"""The KCL processor's checkpoint call (``worker.kcl``), retried while the daemon answers that it is throttled.

amazon_kclpy's ``Checkpointer.checkpoint`` raises ``CheckpointError`` with the daemon's error name: throttling
(``ThrottlingException``, ``KinesisClientLibDependencyException``) is retried CHECKPOINT_TRIES times with the
worker's backoff; any other refusal, or a throttle that outlasts the tries, is raised for the processor to judge.
"""

from __future__ import annotations

from typing import Any

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt

from cleanup.streams.retry_in_place import Backoff
from cleanup.telemetry import log
from schemas.records import record_id
from schemas.settings import Settings

CHECKPOINT_TRIES = 6
RETRYABLE_CHECKPOINT_ERRORS = frozenset({"ThrottlingException", "KinesisClientLibDependencyException"})


def checkpoint(
    checkpointer: Any, sequence_number: str | None, sub_sequence_number: int | None, settings: Settings, shard_id: str
) -> None:
    """``checkpointer.checkpoint(sequence_number, sub_sequence_number)``, retried while it is throttled.

    Raises:
        CheckpointError: refused, or still throttled after CHECKPOINT_TRIES tries.
    """
    from amazon_kclpy.checkpoint_error import CheckpointError

    def retryable(exc: BaseException) -> bool:
        return isinstance(exc, CheckpointError) and str(exc.value) in RETRYABLE_CHECKPOINT_ERRORS

    at = record_id(sequence_number, sub_sequence_number) if sequence_number is not None else None

    def throttled(state: RetryCallState) -> None:
        log.warning("checkpoint throttled; retrying", extra=_line(state, shard_id, at))

    retrying = Retrying(
        retry=retry_if_exception(retryable),
        stop=stop_after_attempt(CHECKPOINT_TRIES),
        wait=Backoff(settings),
        before_sleep=throttled,
        reraise=True,
    )
    retrying(checkpointer.checkpoint, sequence_number, sub_sequence_number)


def _line(state: RetryCallState, shard_id: str, sequence_number: str | None) -> dict[str, Any]:
    error = state.outcome.exception() if state.outcome is not None else None
    return {
        "shardId": shard_id,
        "sequenceNumber": sequence_number,
        "error": str(getattr(error, "value", error)),
        "attempt": state.attempt_number,
    }
