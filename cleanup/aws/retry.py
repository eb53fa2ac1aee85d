"""Retrying transient failures: exponential backoff with full jitter, bounded by attempts and by a deadline."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    retry_if_not_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)
from tenacity.stop import stop_base

from cleanup.deadline import Deadline
from cleanup.exceptions import OutOfTimeError, ThrottledError, TransientError
from schemas.settings import Settings

T = TypeVar("T")

THROTTLED_ATTEMPTS_FACTOR = 4
"""A step refused for its rate is tried this many times as often as RETRY_ATTEMPTS allows for other transient
errors (a throttled request did nothing, and the learnt rate spaces the next); the deadline bounds both."""


class _Attempts(stop_base):
    """Stop after ``limit`` failed tries, throttled ones counting a ``THROTTLED_ATTEMPTS_FACTOR``-th each."""

    def __init__(self, limit: int) -> None:
        self.limit = limit * THROTTLED_ATTEMPTS_FACTOR
        self.spent = 0

    def __call__(self, retry_state: RetryCallState) -> bool:
        failure = retry_state.outcome.exception() if retry_state.outcome is not None else None
        self.spent += 1 if isinstance(failure, ThrottledError) else THROTTLED_ATTEMPTS_FACTOR
        return self.spent >= self.limit


class _OutOfTime(stop_base):
    """Stop when the next backoff would end past the deadline."""

    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.deadline.remaining() <= (retry_state.upcoming_sleep or 0.0)


def call_with_retry(
    fn: Callable[[], T],
    settings: Settings,
    deadline: Deadline,
    on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """Call ``fn``; retry it on ``TransientError`` while attempts and time remain, then re-raise the last error."""
    try:
        return fn()  # most calls succeed at once: no retry controller is built for them (it costs measurable CPU)
    except OutOfTimeError:
        raise
    except TransientError as exc:
        failed: list[TransientError] = [exc]

    def again() -> T:
        if failed:
            raise failed.pop()  # the first try's failure, replayed: the controller counts, waits and stops as usual
        return fn()

    def before_sleep(state: RetryCallState) -> None:
        if on_retry is not None and state.outcome is not None and state.outcome.exception() is not None:
            on_retry(state.outcome.exception())  # type: ignore[arg-type]

    retrying = Retrying(
        # Out of time is transient for the record (its next delivery has time) but final for this call.
        retry=retry_if_exception_type(TransientError) & retry_if_not_exception_type(OutOfTimeError),
        stop=_Attempts(settings.retry_attempts) | _OutOfTime(deadline),
        wait=wait_random_exponential(multiplier=0.05, max=settings.retry_max_wait_seconds),
        before_sleep=before_sleep,
        reraise=True,
    )
    return retrying(again)


class Unprocessed(Exception):
    """DynamoDB left part of a batch request unprocessed (``UnprocessedKeys``, ``UnprocessedItems``): send the rest
    again (``unprocessed_again``)."""


def unprocessed_again(
    tries: int, first: float, longest: float, before_sleep: Callable[[RetryCallState], None]
) -> Retrying:
    """Sending a batch request again while it raises ``Unprocessed``: ``tries`` calls at most, each wait drawn at
    random up to ``first`` doubling to ``longest`` (full jitter, as DynamoDB advises), ``before_sleep`` called before
    each (to stop at the deadline). Any other error ends it at once; running out of tries raises ``RetryError``."""
    return Retrying(
        retry=retry_if_exception_type(Unprocessed),
        stop=stop_after_attempt(tries),
        wait=wait_random_exponential(multiplier=first, max=longest),
        before_sleep=before_sleep,
    )
