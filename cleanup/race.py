"""The reconnect race: a session deleted and then recreated under the same key must keep its live resources.

Before acting, the worker reads the item that now has the deleted item's key (a consistent GetItem). Whatever the
live item still holds (the same connection, grant or scratch prefix) is left alone.
"""

from __future__ import annotations

import base64
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from cleanup.aws_errors import translate
from cleanup.exceptions import BadRecordError
from schemas.attributes import AttributeDecodeError, decode_image
from schemas.session import Session, SessionItemError
from schemas.settings import AttributeNames


def live_session(dynamodb: Any, table: str, keys: dict[str, Any], names: AttributeNames) -> Session | None:
    """The item now stored under ``keys``, or None if there is none.

    Raises:
        TransientError / PermanentError: the read failed.
    """
    wanted = (names.connection_id, names.grant_id, names.scratch_prefix, names.tenant_id)
    try:
        response = dynamodb.get_item(
            TableName=table,
            Key=client_keys(keys),
            ConsistentRead=True,
            ProjectionExpression=", ".join(f"#a{i}" for i in range(len(wanted))),
            ExpressionAttributeNames={f"#a{i}": name for i, name in enumerate(wanted)},
        )
    except (ClientError, BotoCoreError) as exc:
        raise translate(exc, "GetItem") from exc
    item = response.get("Item")
    if not item:
        return None
    try:
        return Session.from_image(decode_image(item, "LiveItem"), names)
    except (AttributeDecodeError, SessionItemError) as exc:
        raise BadRecordError(f"live item under the same key is unreadable: {exc}") from exc


def client_keys(keys: dict[str, Any]) -> dict[str, Any]:
    """Stream-record keys (binary as base64 text) in the form boto3's client sends (binary as bytes)."""
    converted = {}
    for name, value in keys.items():
        if isinstance(value, dict) and isinstance(value.get("B"), str):
            value = {"B": base64.b64decode(value["B"])}
        converted[name] = value
    return converted
