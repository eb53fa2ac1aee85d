"""The dead-letter queue: where records that failed permanently go, whole, with their error.

A record is only taken off the failure list once SQS has accepted it; if the send fails the record stays failed and
is reported, so it is retried instead of lost.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from cleanup.telemetry import log
from schemas.outcomes import Outcome
from schemas.records import StreamRecord, UnreadableRecord

SQS_BATCH = 10
MESSAGE_FORMAT = "session-cleanup.dead-letter.v1"


def message_body(outcome: Outcome, record: StreamRecord | UnreadableRecord, attempts: int = 1) -> str:
    """The dead-letter message: the full record as received, why it failed, and after how many tries."""
    source = record.source.value if isinstance(record, StreamRecord) else None
    return json.dumps(
        {
            "format": MESSAGE_FORMAT,
            "sequenceNumber": outcome.sequence_number,
            "eventID": outcome.event_id,
            "source": source,
            "error": outcome.error,
            "attempts": attempts,
            "actions": [a.model_dump(mode="json") for a in outcome.actions],
            "failedAt": int(time.time()),
            "record": record.raw,
        },
        default=str,
    )


def dead_letter(
    outcomes: list[Outcome],
    records: Sequence[StreamRecord | UnreadableRecord],
    runtime: Any,
    only: Collection[str] | None = None,
    attempts: Mapping[str, int] | None = None,
) -> list[Outcome]:
    """Send permanent failures to DEAD_LETTER_QUEUE_URL (when set); returns outcomes marked ``dead_lettered``.

    ``only`` names instead the failures to send, permanent or not (the records a consumer gives up on); ``attempts``
    says how many times each record was tried (once when not given).
    """
    queue = runtime.settings.dead_letter_queue_url
    if not queue:
        return outcomes
    pending = [
        i
        for i, outcome in enumerate(outcomes)
        if outcome.failed and (outcome.permanent if only is None else outcome.sequence_number in only)
    ]
    tries = attempts or {}
    result = list(outcomes)
    for start in range(0, len(pending), SQS_BATCH):
        chunk = pending[start : start + SQS_BATCH]
        entries = [
            {
                "Id": str(i),
                "MessageBody": message_body(outcomes[i], records[i], tries.get(outcomes[i].sequence_number, 1)),
            }
            for i in chunk
        ]
        for index in _send(runtime.clients.sqs, queue, entries):
            result[index] = outcomes[index].model_copy(update={"dead_lettered": True})
    return result


def _send(sqs: Any, queue: str, entries: list[dict[str, str]]) -> list[int]:
    try:
        response = sqs.send_message_batch(QueueUrl=queue, Entries=entries)
    except (ClientError, BotoCoreError) as exc:
        log.error("dead-letter queue send failed; the records stay failed", extra={"error": str(exc)})
        return []
    for failure in response.get("Failed", []):
        log.error("dead-letter queue refused a record; it stays failed", extra={"error": failure.get("Message")})
    return [int(entry["Id"]) for entry in response.get("Successful", [])]
