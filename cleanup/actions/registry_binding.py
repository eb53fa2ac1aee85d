"""Which of a connection's memberships are its session's: SESSION_BINDING for the connection registry.

A made-up REMOVE (whoever can invoke the function directly) may name a live connection's id under a key of its own
making: by the connection id alone, it would free that connection's memberships. With SESSION_BINDING on, a
membership is deleted only where the table says it is held by the record's session: its session-id attribute
(ATTR_REGISTRY_SESSION_ID, which ``join_room`` writes) is the id the record's key names. The index the memberships
are found by projects keys only, so the table is read for them, consistently: one BatchGetItem per page of
memberships. A membership written without a session id cannot be bound to one, and is kept, left to its own TTL.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from cleanup.aws.calls import call
from cleanup.aws.permits import key_text
from cleanup.deadline import Deadline
from cleanup.exceptions import OutOfTimeError, TransientError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

    from cleanup.actions.registry import Registry

ROUNDS = 8  # BatchGetItem calls for the keys DynamoDB leaves unprocessed


class _Unprocessed(TransientError):
    """Keys DynamoDB left unprocessed: asked again, backing off."""


def held_by(
    dynamodb: DynamoDBClient,
    registry: Registry,
    keys: Sequence[dict[str, Any]],
    connection_id: str,
    session_id: str | None,
    deadline: Deadline,
) -> list[dict[str, Any]]:
    """Those of ``keys`` (at most 100) whose item, read now, is ``connection_id``'s and held by ``session_id``.

    Raises:
        TransientError / PermanentError: the read failed, or its answer could not be understood.
    """
    if session_id is None or registry.session_attribute is None:
        return []
    wanted = {"S": connection_id}, {"S": session_id}
    found = _read(dynamodb, registry, keys, deadline)
    return [
        key
        for key in keys
        if (item := found.get(key_text(key))) is not None
        and (item.get(registry.attribute), item.get(registry.session_attribute)) == wanted
    ]


def _read(
    dynamodb: DynamoDBClient, registry: Registry, keys: Sequence[dict[str, Any]], deadline: Deadline
) -> dict[str, dict[str, Any]]:
    """The items under ``keys`` in the registry, by ``key_text`` of their key (a key with no item is absent)."""
    attributes = dict.fromkeys((*registry.keys, registry.attribute, registry.session_attribute or registry.attribute))
    aliases = {f"#a{i}": name for i, name in enumerate(attributes)}
    pending = list(keys)
    found: dict[str, dict[str, Any]] = {}

    def ask() -> None:
        request: Any = {
            "Keys": pending,
            "ConsistentRead": True,
            "ProjectionExpression": ", ".join(aliases),
            "ExpressionAttributeNames": aliases,
        }
        answer: Mapping[str, Any] = call(
            dynamodb.batch_get_item, "BatchGetItem", deadline, RequestItems={registry.table: request}
        )
        for item in _items(answer, registry.table):
            found[key_text({name: item.get(name) for name in registry.keys})] = item
        left: Any = ((answer.get("UnprocessedKeys") or {}).get(registry.table) or {}).get("Keys") or []
        pending[:] = [dict(key) for key in left if isinstance(key, Mapping)]
        if pending:
            raise _Unprocessed(f"BatchGetItem: {len(pending)} memberships unprocessed in {registry.table!r}")

    retrying = Retrying(
        retry=retry_if_exception_type(_Unprocessed),
        stop=stop_after_attempt(ROUNDS),
        wait=wait_random_exponential(multiplier=0.05, max=1.0),
        before_sleep=lambda _: _time_left(deadline),
        reraise=True,
    )
    retrying(ask)
    return found


def _items(answer: Mapping[str, Any], table: str) -> list[dict[str, Any]]:
    """The items an answer holds for ``table``; one that does not name it (a cut body) cannot say who holds them."""
    responses = answer.get("Responses")
    items = responses.get(table) if isinstance(responses, Mapping) else None
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise TransientError(f"BatchGetItem answered without {table!r} under Responses: cannot tell whose they are")
    return items


def _time_left(deadline: Deadline) -> None:
    if deadline.remaining() <= 1.0:
        raise OutOfTimeError("the deadline came before the registry's unprocessed keys were asked again")
