"""The same actions as the baseline, run under Powertools' ``BatchProcessor`` (EventType.DynamoDBStreams).

Powertools decodes each record (its own TypeDeserializer, base64 binary included), calls the record handler one record
after another, and builds the partial batch response from the records whose handler raised.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import (
    DynamoDBRecord,
    DynamoDBRecordEventName,
)

from benchmarks.baseline_sequential import SequentialHandler


class PowertoolsHandler:
    """``handler(event, context)`` returning ``batchItemFailures``, with the baseline's cleanup per record."""

    def __init__(self, *, bucket: str, kms_key_id: str, callback_url: str) -> None:
        self.actions = SequentialHandler(bucket=bucket, kms_key_id=kms_key_id, callback_url=callback_url)
        self.processor = BatchProcessor(event_type=EventType.DynamoDBStreams)

    def record_handler(self, record: DynamoDBRecord) -> None:
        if record.event_name is not DynamoDBRecordEventName.REMOVE or record.dynamodb is None:
            return
        old_image = record.dynamodb.old_image
        if not old_image:
            return
        identity = record.user_identity or {}
        reason = "ttl" if identity.get("principalId") == "dynamodb.amazonaws.com" else "explicit"
        self.actions.cleanup_session(old_image, reason)

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        return dict(process_partial_response(event, self.record_handler, self.processor, context))
