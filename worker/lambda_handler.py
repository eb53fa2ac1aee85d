"""Lambda entry point for an event source mapping with ReportBatchItemFailures, on the session table's DynamoDB stream
or on the Kinesis data stream it streams to (Kinesis Data Streams for DynamoDB).

Returns ``{"batchItemFailures": [{"itemIdentifier": <SequenceNumber>}, ...]}``: every record that is not clean, except
those accepted by the dead-letter queue, named by ``dynamodb.SequenceNumber`` (a DynamoDB stream) or by
``kinesis.sequenceNumber`` (a Kinesis stream, whose ``data`` is decoded as the KCL processor decodes it). Lambda then
resumes from the lowest reported sequence number, which cleanup tolerates because every action is idempotent.
"""

from __future__ import annotations

import logging
from typing import Any

from cleanup.aws.retry import Deadline
from cleanup.pipeline import run_batch
from cleanup.runtime import WarmRuntime
from schemas.outcomes import Outcome
from schemas.records import read_lambda_event
from worker import floors

warm = WarmRuntime()
"""The runtime kept between invocations (``warm.use(runtime)`` hands the handler another)."""


def handler(event: dict[str, Any], context: Any) -> dict[str, list[dict[str, str]]]:
    """Clean the sessions of one batch and report the records that are not clean."""
    if (problem := floors.core_problem()) is not None:
        return refuse_batch(event, problem)
    records = read_lambda_event(event)
    outcomes = run_batch(records, warm.get(), Deadline.from_lambda_context(context))
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


def refuse_batch(event: dict[str, Any], problem: str) -> dict[str, list[dict[str, str]]]:
    """Fail every record of the batch, untouched, with one ERROR line: a library here is below its floor.

    The sequence numbers are read from the raw event (not through pydantic, which may be the library at fault); the
    records stay in the stream for the fixed deployment to clean.
    """
    logging.getLogger("cleanup").error("refusing the batch: %s", problem)
    numbers = [
        (record.get("dynamodb") or {}).get("SequenceNumber") or (record.get("kinesis") or {}).get("sequenceNumber")
        for record in event.get("Records", [])
    ]
    return {"batchItemFailures": [{"itemIdentifier": str(number)} for number in numbers if number]}
