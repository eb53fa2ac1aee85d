"""Lambda entry point for an event source mapping with ReportBatchItemFailures, on the session table's DynamoDB stream
or on the Kinesis data stream it streams to (Kinesis Data Streams for DynamoDB).

Returns ``{"batchItemFailures": [{"itemIdentifier": <SequenceNumber>}, ...]}``: every record that is not clean, except
those accepted by the dead-letter queue, named by ``dynamodb.SequenceNumber`` (a DynamoDB stream) or by
``kinesis.sequenceNumber`` (a Kinesis stream, whose ``data`` is decoded as the KCL processor decodes it). Lambda then
resumes from the lowest reported sequence number, which cleanup tolerates because every action is idempotent.

The kill switch is read at the start of every invocation. Set to dry-run while the deployment enforces
(CLEANUP_MODE=enforce), the batch is planned (logged and counted as a dry run) and then held exactly as under a pause:
the mapping must not move past records that were only planned. Paused, or unknown (a cold start that could not read it
yet: ``cleanup.killswitch``), nothing is touched. With a backlog (BACKLOG_QUEUE_URL), every session record
goes to it with all its actions left, and waits there (14 days) until the drain, once the switch allows, cleans it:
the stream moves on and no retry is spent. Without one, an unknown switch is read again (every
``UNKNOWN_WAIT_POLL_SECONDS``) for up to half of what is left of the invocation: if it answers enforce or dry-run, the
batch is processed in this invocation and no retry is spent. Paused, or still unknown then, the handler raises
``PausedError``: the invocation fails, so the mapping delivers the whole batch again, whatever its
FunctionResponseTypes say (a partial batch response naming every record would be taken for success by a mapping
without ReportBatchItemFailures, and the records would be lost). Each such failure spends one of the mapping's
MaximumRetryAttempts; once they are spent the batch's range goes to the on-failure queue, and only ``cleanup-worker
redrive`` brings it back, while the stream still holds it (24 h): that is why the template deploys a backlog. How
long records wait so: docs/operate.md, "The kill switch".
"""

from __future__ import annotations

import logging
import time
from typing import Any

from cleanup.core.pipeline import Incoming
from cleanup.deadline import Deadline
from cleanup.exceptions import PausedError
from cleanup.killswitch import Mode, settings_for
from cleanup.queues.reporting import run_batch
from cleanup.runtime import Runtime, WarmRuntime
from schemas.outcomes import Outcome
from schemas.records import Source, StreamRecord, UnreadableRecord, read_lambda_event, stream_table
from worker import floors

warm = WarmRuntime()
"""The runtime kept between invocations (``warm.use(runtime)`` hands the handler another)."""


def handler(event: dict[str, Any], context: Any) -> dict[str, list[dict[str, str]]]:
    """Clean the sessions of one batch and report the records that are not clean.

    Without SESSION_TABLE, the table of the mapping's DynamoDB stream (its records' ``eventSourceARN``, which Lambda
    sets) is the session table; a Kinesis stream may carry several tables', so its records still need SESSION_TABLE.
    """
    if (problem := floors.core_problem()) is not None:
        return refuse_batch(event, problem)
    records = read_lambda_event(event)
    runtime = warm.get()
    table = mapping_table(records)
    if table is not None:
        runtime = runtime.with_session_table(table)
    deadline = Deadline.from_lambda_context(context)
    mode = runtime.refresh_mode()
    if mode is Mode.PAUSED:
        return hold(records, runtime, deadline)
    if mode is not runtime.switch.environment:  # a dry run set on the switch while the deployment enforces
        return plan_and_hold(records, runtime, deadline)
    outcomes = run_batch(records, runtime, deadline)
    return batch_response(outcomes)


PAUSED = "paused by the kill switch: nothing was done; the record waits in the backlog"
UNKNOWN = "the kill switch cannot be read (switch unknown: holding): nothing was done; the record waits in the backlog"
PLANNED = (
    "the kill switch is set to dry-run while the deployment enforces: planned, nothing was done; the record waits in "
    "the backlog"
)
UNKNOWN_WAIT_POLL_SECONDS = 0.5


def plan_and_hold(records: list[Incoming], runtime: Runtime, deadline: Deadline) -> dict[str, list[dict[str, str]]]:
    """A batch under a dry run set on the switch, in a deployment that enforces: planned (logged and counted, what a
    dry run is for), then held as under a pause, so that the enforce pass cleans it. The mapping moving past records
    it only planned would leave their sessions' grants usable with no end.

    Raises:
        PausedError: no backlog: the batch is left in the stream and delivered again (``hold``).
    """
    run_batch(records, runtime, deadline)  # the dry run in force: plans, changes nothing, sends nothing
    runtime.settings = settings_for(runtime.settings, runtime.switch.environment)  # held as the deployment would
    return hold(records, runtime, deadline, why=PLANNED)


def hold(
    records: list[Incoming], runtime: Runtime, deadline: Deadline, *, why: str | None = None
) -> dict[str, list[dict[str, str]]]:
    """A batch the switch holds (paused, unknown, or a dry run ``why`` says): to the backlog untouched, or, without
    one, back to the stream.

    Raises:
        PausedError: no backlog, and the switch still holds the batch (after waiting for an unknown one).
    """
    runtime.metrics.count("PausedBatches")
    unknown = runtime.switch.unknown
    if runtime.settings.backlog_for_writing:  # held durably (14 days), untouched, and drained once resumed
        return batch_response(run_batch(records, runtime, deadline, held=why or (UNKNOWN if unknown else PAUSED)))
    if unknown and _wait_for_switch(runtime, deadline) is not Mode.PAUSED:
        return batch_response(run_batch(records, runtime, deadline))  # it answered in time: no retry spent
    runtime.metrics.flush()
    state = "cannot be read (switch unknown: holding)" if runtime.switch.unknown else "pauses cleanup"
    state = "is set to dry-run while the deployment enforces" if why == PLANNED else state
    raise PausedError(f"the kill switch {state}: the batch is left in the stream, and delivered again")


def _wait_for_switch(runtime: Runtime, deadline: Deadline) -> Mode:
    """Read an unknown switch again until it answers, for up to half of what is left of the invocation."""
    until = time.monotonic() + (0.0 if deadline.at is None else deadline.remaining() / 2)  # no deadline: no wait
    mode = Mode.PAUSED
    while runtime.switch.unknown and time.monotonic() + UNKNOWN_WAIT_POLL_SECONDS < until:
        time.sleep(UNKNOWN_WAIT_POLL_SECONDS)
        mode = runtime.refresh_mode()
    return mode


def mapping_table(records: list[StreamRecord | UnreadableRecord]) -> str | None:
    """The table whose DynamoDB stream the event came from: named by its first record's ``eventSourceARN``."""
    arns = (r.event_source_arn for r in records if isinstance(r, StreamRecord) and r.source is Source.LAMBDA)
    return next((table for table in map(stream_table, arns) if table), None)


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

    The sequence numbers are read from the raw event (not through pydantic, which may be the library at fault). The
    build refuses such an artifact (``worker.floors``), so this runs only where something shadows the artifact's
    libraries: the mapping then retries the batch MaximumRetryAttempts times and sends its range to the on-failure
    queue, from which ``cleanup-worker redrive`` re-reads it (while the stream holds it, 24 h) once fixed.
    """
    logging.getLogger("cleanup").error("refusing the batch: %s", problem)
    numbers = [
        (record.get("dynamodb") or {}).get("SequenceNumber") or (record.get("kinesis") or {}).get("sequenceNumber")
        for record in event.get("Records", [])
    ]
    return {"batchItemFailures": [{"itemIdentifier": str(number)} for number in numbers if number]}
