"""Whether a session found only by its resources is live: any item under its partition key says it may be.

Reconcile has no record of the session, only the id its resources are named by, and spells the session's key from it
(``leaks.session_key``). A table whose items sit at another sort key than the one configured, or whose partition
holds other rows of a live session, must not make a live session look gone: its partition is queried (consistent,
``Limit=1``), and any item there is an answer. The session's own item (at SESSION_SORT_KEY, or the table's only
item on a table without a sort key) is read for its ``ttl``; any other item counts as live, whatever it holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cleanup.aws.calls import call
from cleanup.deadline import Deadline
from cleanup.exceptions import BadRecordError, TransientError
from schemas.attributes import AttributeDecodeError
from schemas.session import Session, SessionItemError
from schemas.settings import AttributeNames

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient


@dataclass(frozen=True)
class Found:
    """What a partition holds: nothing (``session`` None, ``other`` False), the session's own item (``session``), or
    another item, which counts as live (``other``)."""

    session: Session | None = None
    other: bool = False


def partition(
    dynamodb: DynamoDBClient,
    table: str,
    key: Mapping[str, Any],
    names: AttributeNames,
    deadline: Deadline,
    extra: tuple[str, ...] = (),
) -> Found:
    """The first item under ``key``'s partition key in ``table`` (consistent), judged against ``key``.

    Raises:
        TransientError / PermanentError: the query failed, or its answer does not say what the partition holds.
        BadRecordError: the session's own item cannot be read (nothing may then be freed).
    """
    partition_key = names.pk
    answer: Mapping[str, Any] = call(
        dynamodb.query,
        "Query",
        deadline,
        TableName=table,
        KeyConditionExpression="#pk = :pk",
        ExpressionAttributeNames={"#pk": partition_key},
        ExpressionAttributeValues={":pk": key[partition_key]},
        ConsistentRead=True,
        Limit=1,
    )
    items = answer.get("Items")
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise TransientError(f"Query of {table!r} answered without Items: cannot tell whether the session is live")
    if not items:
        return Found()
    item = items[0]
    if any(item.get(name) != value for name, value in key.items()):
        return Found(other=True)
    try:
        return Found(Session.decode(item, names, extra, "LiveItem"))
    except (AttributeDecodeError, SessionItemError) as exc:
        raise BadRecordError(f"the session's item is unreadable: {exc}") from exc
