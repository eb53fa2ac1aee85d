"""The moment by which a batch must be answered: an invocation's end, less a margin for reporting and answering."""

from __future__ import annotations

import time

SAFETY_MARGIN_SECONDS = 2.0
"""Time kept after the last try: for reporting's calls (tagging and sending dead letters and backlog messages, each
needing at least a connect and a short read to be started at all) and then for answering the invocation."""
ANSWER_MARGIN_SECONDS = 0.5
"""Of that margin, what reporting leaves for answering the invocation."""


class Deadline:
    """The moment by which a batch must be answered (a Lambda invocation's end, less a margin), or none."""

    def __init__(self, at: float | None = None) -> None:
        self.at = at

    @classmethod
    def after(cls, seconds: float | None) -> Deadline:
        return cls(None if seconds is None else time.monotonic() + seconds)

    @classmethod
    def from_lambda_context(cls, context: object) -> Deadline:
        remaining = getattr(context, "get_remaining_time_in_millis", None)
        if remaining is None:
            return cls()
        return cls.after(max(0.0, remaining() / 1000.0 - SAFETY_MARGIN_SECONDS))

    def extended(self, seconds: float) -> Deadline:
        """The same deadline ``seconds`` later (for reporting, which may use part of the margin kept for it)."""
        return self if self.at is None else Deadline(self.at + seconds)

    def for_reporting(self) -> Deadline:
        """The same deadline moved into the margin kept after it: reporting may use all of it but ANSWER_MARGIN_SECONDS,
        which is left for answering the invocation."""
        return self.extended(SAFETY_MARGIN_SECONDS - ANSWER_MARGIN_SECONDS)

    def remaining(self) -> float:
        return float("inf") if self.at is None else self.at - time.monotonic()
