"""The two alternatives the worker is measured against: one record after another, as the source design's handler.

``SequentialHandler``, the baseline: a stream handler written the way the source design's handler works, in Python
with boto3. One record after another; ``unmarshall`` of the OldImage; DeleteConnection (any error ignored),
RetireGrant (errors logged), then ListObjectsV2 + DeleteObjects page by page. No race check, no retries of its own, no
concurrency.

``PowertoolsHandler``: the same actions run under Powertools' ``BatchProcessor`` (EventType.DynamoDBStreams).
Powertools decodes each record (its own TypeDeserializer, base64 binary included), calls the record handler one record
after another, and builds the partial batch response from the records whose handler raised.
"""

from __future__ import annotations

import contextlib
from typing import Any

import boto3
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import (
    DynamoDBRecord,
    DynamoDBRecordEventName,
)
from boto3.dynamodb.types import TypeDeserializer

_deserializer = TypeDeserializer()


def unmarshall(image: dict[str, Any]) -> dict[str, Any]:
    """What ``@aws-sdk/util-dynamodb``'s unmarshall does, with boto3's TypeDeserializer."""
    return {name: _deserializer.deserialize(value) for name, value in image.items()}


class SequentialHandler:
    """``handler(event, context)`` for a DynamoDB Streams event source mapping, as in the source design."""

    def __init__(self, *, bucket: str, kms_key_id: str, callback_url: str) -> None:
        self.bucket = bucket
        self.kms_key_id = kms_key_id
        self.apigw = boto3.client("apigatewaymanagementapi", endpoint_url=callback_url)
        self.s3 = boto3.client("s3")
        self.kms = boto3.client("kms")

    def __call__(self, event: dict[str, Any], context: Any) -> None:
        for record in event["Records"]:
            if record["eventName"] != "REMOVE":
                continue
            old_image = record.get("dynamodb", {}).get("OldImage")
            if not old_image:
                continue
            identity = record.get("userIdentity") or {}
            ttl_expiry = identity.get("type") == "Service" and identity.get("principalId") == "dynamodb.amazonaws.com"
            self.cleanup_session(unmarshall(old_image), "ttl" if ttl_expiry else "explicit")

    def cleanup_session(self, session: dict[str, Any], reason: str) -> None:
        if session.get("connectionId"):
            with contextlib.suppress(Exception):  # "already gone: fine", as in the source design
                self.apigw.delete_connection(ConnectionId=session["connectionId"])
        if session.get("grantId") and self.kms_key_id:
            try:
                self.kms.retire_grant(KeyId=self.kms_key_id, GrantId=session["grantId"])
            except Exception as exc:  # the source design logs and goes on
                print("retire_grant_failed", session["pk"], exc)
        self.delete_prefix(session["scratchPrefix"])

    def delete_prefix(self, prefix: str) -> None:
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
            if token:
                kwargs["ContinuationToken"] = token
            listed = self.s3.list_objects_v2(**kwargs)
            keys = [item["Key"] for item in listed.get("Contents", [])]
            if keys:
                self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": [{"Key": key} for key in keys]})
            token = listed.get("NextContinuationToken") if listed.get("IsTruncated") else None
            if not token:
                return


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
