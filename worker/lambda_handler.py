"""Lambda entry point for a DynamoDB Streams event source mapping with ReportBatchItemFailures.

Returns ``{"batchItemFailures": [{"itemIdentifier": <SequenceNumber>}, ...]}``: every record that is not clean, except
those accepted by the dead-letter queue. Lambda then resumes from the lowest reported sequence number, which cleanup
tolerates because every action is idempotent.
"""

from __future__ import annotations

from typing import Any

from cleanup.pipeline import run_batch
from cleanup.retry import Deadline
from cleanup.runtime import Runtime
from schemas.outcomes import Outcome
from schemas.records import read_lambda_event

_runtime: Runtime | None = None


def runtime() -> Runtime:
    """The process's runtime, built from the environment on the first invocation and kept while warm.

    Invalid settings fail the invocation with one ERROR line naming them (``Runtime.for_lambda``); nothing is kept,
    so the next invocation reads the environment again.
    """
    global _runtime
    if _runtime is None:
        _runtime = Runtime.for_lambda()
    return _runtime


def handler(event: dict[str, Any], context: Any) -> dict[str, list[dict[str, str]]]:
    """Clean the sessions of one batch and report the records that are not clean."""
    records = read_lambda_event(event)
    outcomes = run_batch(records, runtime(), Deadline.from_lambda_context(context))
    return batch_response(outcomes)


def batch_response(outcomes: list[Outcome]) -> dict[str, list[dict[str, str]]]:
    """The partial batch response: failed records not taken by the dead-letter queue."""
    return {
        "batchItemFailures": [
            {"itemIdentifier": outcome.sequence_number}
            for outcome in outcomes
            if outcome.failed and not outcome.dead_lettered
        ]
    }
