"""Reading DynamoDB Streams losslessly: the records exactly as the service sent them.

boto3 turns ApproximateCreationDateTime into a datetime and binary values into bytes. Capture, replay and the
dead-letter queue want the wire JSON (base64 binary, epoch seconds), so the raw response body is kept alongside.
"""

from __future__ import annotations

import json
import threading
from typing import Any

_local = threading.local()


def _keep_body(http_response: Any, **_: Any) -> None:
    _local.body = http_response.content


def raw_get_records(streams: Any, shard_iterator: str, limit: int | None = None) -> dict[str, Any]:
    """GetRecords, returning the response's JSON as sent (``Records`` and ``NextShardIterator``)."""
    event = "after-call.dynamodbstreams.GetRecords"
    streams.meta.events.register(event, _keep_body, unique_id="cleanup-keep-body")
    kwargs: dict[str, Any] = {"ShardIterator": shard_iterator}
    if limit is not None:
        kwargs["Limit"] = limit
    _local.body = None
    parsed = streams.get_records(**kwargs)
    body = _local.body
    if not body:
        return {"Records": [], "NextShardIterator": parsed.get("NextShardIterator")}
    raw: dict[str, Any] = json.loads(body)
    return raw
