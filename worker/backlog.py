"""Lambda entry point draining the backlog queue (an SQS event source mapping with ReportBatchItemFailures and a small
``ScalingConfig.MaximumConcurrency``), through the same core as the stream.

Each message names a record and the actions it has left (``cleanup.backlog``); the record is cleaned with only those,
the live item read again first as always, at the rate the service allows. A message whose record is not clean yet is
reported (``batchItemFailures``): SQS makes it visible again after the queue's visibility timeout, and after the
queue's maxReceiveCount moves it to the backlog's dead-letter queue. A record that fails permanently goes to
DEAD_LETTER_QUEUE_URL as any other, and its message is done. Nothing is deferred again from here: this function's
BACKLOG_QUEUE_URL is ignored.
"""

from __future__ import annotations

from typing import Any

from cleanup.aws.retry import Deadline
from cleanup.backlog import only_remaining, read_message
from cleanup.exceptions import CleanupError
from cleanup.operations.claim_check import StoredRecord, read_stored
from cleanup.pipeline import run_batch
from cleanup.runtime import Runtime, WarmRuntime
from cleanup.telemetry import log
from schemas.records import RecordError, StreamRecord, UnreadableRecord, read_record

warm = WarmRuntime()
"""The runtime kept between invocations (``warm.use(runtime)`` hands the handler another)."""


def handler(event: dict[str, Any], context: Any) -> dict[str, list[dict[str, str]]]:
    """Clean what the backlog's messages have left; report the messages that are not done."""
    return drain(event.get("Records") or [], warm.get(), Deadline.from_lambda_context(context))


def drain(messages: list[dict[str, Any]], runtime: Runtime, deadline: Deadline) -> dict[str, list[dict[str, str]]]:
    """Clean the records of SQS messages (``messageId``, ``body``); the partial batch response naming those left."""
    failed: list[str] = []
    records: list[StreamRecord | UnreadableRecord] = []
    ids: list[str] = []
    for message in messages:
        message_id = str(message.get("messageId"))
        record = _record(message, runtime)
        if record is None:
            failed.append(message_id)
            continue
        records.append(record)
        ids.append(message_id)
    outcomes = run_batch(records, runtime, deadline, backlog=False) if records else []
    failed += [ids[i] for i, outcome in enumerate(outcomes) if outcome.failed and not outcome.dead_lettered]
    return {"batchItemFailures": [{"itemIdentifier": message_id} for message_id in failed]}


def _record(message: dict[str, Any], runtime: Runtime) -> StreamRecord | UnreadableRecord | None:
    """The message's record, cut to its actions left; None (reported, kept) when it cannot be read now."""
    try:
        body, remaining = read_message(str(message.get("body", "")))
        location = body.get("recordObject")
        if isinstance(location, dict):  # the claim-check: only DEAD_LETTER_BUCKET / PREFIX, checked by read_stored
            stored = StoredRecord(
                str(location.get("bucket")), str(location.get("key")), location.get("versionId"), None
            )
            whole = read_stored(runtime, stored)
            if whole is None:
                raise CleanupError(f"the backlog message's stored record {stored} is missing")
            body = {**whole, "remaining": remaining}
        raw = body.get("record")
        if not isinstance(raw, dict):
            raise CleanupError("the backlog message holds no record")
        return read_record(only_remaining(raw, remaining, runtime.settings.attributes))
    except (CleanupError, RecordError) as exc:
        log.error(
            "backlog message not readable; kept", extra={"messageId": message.get("messageId"), "error": str(exc)}
        )
        return None
