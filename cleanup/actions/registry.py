"""Remove a closed connection's room memberships from the connection registry.

A connection registry holds one item per (room, connection) membership (``pk = room#<roomId>#<shard>``,
``sk = conn#<connectionId>``) and a global secondary index on the connection id (``byConnection``). A dead
connection's memberships would otherwise stay until their own TTL, and every broadcast to those rooms would post to
the closed socket and get a 410. The index is queried for the connection id, one page at a time, and each page's
memberships are deleted with BatchWriteItem, 25 keys a call; UnprocessedItems are sent again with backoff.

What is deleted, and how:

* The index is eventually consistent, and what it returns is data read back, not a promise: an item is deleted only
  if its connection-id attribute is exactly this connection id, and its key itself names the connection (a key
  attribute is the id, or has it as a ``#``-separated part, as ``conn#<id>``). Keys never change, so a membership
  keyed by this connection is this connection's even when the index lags behind the table; a row keyed otherwise
  (by user, with its connection id rewritten on a reconnect) could be someone else's by now, and is kept.
* Only the item's own key is sent: the table's key attributes (DescribeTable, once per process), nothing else.
* A membership written after the Query (the index lags behind the table) is not seen: it is left to its TTL.

``remove`` deletes memberships already found (by reconcile's Scan, ``cleanup.operations.leaks``) in the same
batches, behind the same permit.

The deadline is checked between pages and between calls (and ``cleanup.aws.pacing`` bounds each call by it): out of
time, what was deleted stays deleted and the record is reported transient, so the rest goes on its next delivery.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tenacity import RetryCallState, RetryError

from cleanup.actions.registry_binding import held_by
from cleanup.aws.calls import call
from cleanup.aws.retry import Unprocessed, unprocessed_again
from cleanup.core.action_api import ActionKind, Context, Gate, Holding, Host, Orphan, Step
from cleanup.core.guard import connection_id as connection_id_of
from cleanup.core.guard import session_id as session_id_of
from cleanup.deadline import Deadline
from cleanup.exceptions import NowHeldError, OutOfTimeError, PermanentError, TransientError
from schemas.outcomes import ActionStatus
from schemas.session import Session
from schemas.settings import Binding

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import (
        WriteRequestOutputTypeDef,
        WriteRequestTypeDef,
    )

ACTION = "registry"
BATCH = 25  # BatchWriteItem's limit
QUERY_PAGE = 100  # memberships read, and deleted, at a time
UNPROCESSED_TRIES = 8  # BatchWriteItem calls for one batch while DynamoDB leaves some of it unprocessed
FIRST_WAIT_SECONDS = 0.05


@dataclass(frozen=True, slots=True)
class Registry:
    """Where a connection's memberships are: the table, its index on the connection id, and that attribute."""

    table: str
    index: str
    attribute: str
    keys: tuple[str, ...]
    """The table's key attributes (partition key, then sort key)."""
    session_attribute: str | None = None
    """With SESSION_BINDING: the memberships' session-id attribute (ATTR_REGISTRY_SESSION_ID), which must name the
    record's session for a membership to be deleted."""


@dataclass(frozen=True, slots=True)
class Pruned:
    """How many memberships were deleted (or, in a dry run, would be), and how many the index named but were kept."""

    deleted: int
    kept: int


def prune(
    dynamodb: DynamoDBClient,
    registry: Registry,
    connection_id: str,
    deadline: Deadline,
    *,
    permit: Gate,
    max_wait: float = 2.0,
    session_id: str | None = None,
) -> Pruned:
    """Delete every membership of ``connection_id`` the index knows (with ``registry.session_attribute``, only those
    held by ``session_id``); each BatchWriteItem (a re-send of unprocessed items too) with its permit asked of
    ``permit`` where it leaves (``cleanup.aws.permits``).

    Raises:
        NowHeldError: ``permit`` keeps the memberships (a live session holds the connection).
        OutOfTimeError: the deadline came first; what was deleted stays deleted.
        TransientError: throttling, 5xx, or items DynamoDB kept leaving unprocessed.
        PermanentError: access denied, a missing table or index, and anything else.
    """
    deleted = kept = 0
    try:
        for page in _pages(dynamodb, registry, connection_id, deadline):
            keys, foreign = _own_keys(dynamodb, page, registry, connection_id, session_id, deadline)
            kept += foreign
            for start in range(0, len(keys), BATCH):
                _out_of_time(deadline, "the deadline came before the next batch")
                _delete_all(dynamodb, registry.table, keys[start : start + BATCH], deadline, permit, max_wait)
                deleted += len(keys[start : start + BATCH])
    except NowHeldError as exc:
        raise NowHeldError(str(exc), deleted) from exc
    except OutOfTimeError as exc:
        raise OutOfTimeError(
            f"{exc}; {deleted} memberships of {connection_id!r} deleted so far, the rest on the record's next delivery"
        ) from exc
    return Pruned(deleted, kept)


def remove(
    dynamodb: DynamoDBClient,
    table: str,
    keys: Sequence[dict[str, Any]],
    deadline: Deadline,
    *,
    permit: Gate,
    max_wait: float = 2.0,
) -> int:
    """Delete the memberships under ``keys`` (each one of the connection ``permit`` guards: see ``own_key``), 25 a
    BatchWriteItem, each call (a re-send of unprocessed items too) once ``permit`` lets it. For reconcile, which
    found the keys by a Scan.

    Returns:
        How many memberships were deleted (a key with no item counts: BatchWriteItem cannot tell).

    Raises:
        NowHeldError: ``permit`` keeps the memberships; those of earlier calls stay deleted.
        OutOfTimeError / TransientError / PermanentError: as ``prune``.
    """
    deleted = 0
    for start in range(0, len(keys), BATCH):
        _out_of_time(deadline, "the deadline came before the next batch")
        _delete_all(dynamodb, table, list(keys[start : start + BATCH]), deadline, permit, max_wait)
        deleted += len(keys[start : start + BATCH])
    return deleted


def count(
    dynamodb: DynamoDBClient, registry: Registry, connection_id: str, deadline: Deadline, session_id: str | None = None
) -> Pruned:
    """How many memberships ``prune`` would delete, and keep (read-only; for dry runs)."""
    deleted = kept = 0
    for page in _pages(dynamodb, registry, connection_id, deadline):
        keys, foreign = _own_keys(dynamodb, page, registry, connection_id, session_id, deadline)
        deleted, kept = deleted + len(keys), kept + foreign
    return Pruned(deleted, kept)


def _pages(
    dynamodb: DynamoDBClient, registry: Registry, connection_id: str, deadline: Deadline
) -> Iterator[list[dict[str, Any]]]:
    names = {f"#a{i}": name for i, name in enumerate(dict.fromkeys((*registry.keys, registry.attribute)))}
    request: dict[str, Any] = {
        "TableName": registry.table,
        "IndexName": registry.index,
        "KeyConditionExpression": "#c = :c",
        "ExpressionAttributeNames": {**names, "#c": registry.attribute},
        "ExpressionAttributeValues": {":c": {"S": connection_id}},
        "ProjectionExpression": ", ".join(names),
        "Limit": QUERY_PAGE,
    }
    while True:
        _out_of_time(deadline, "the deadline came before the next page")
        page = call(dynamodb.query, "Query", deadline, **request)
        yield list(page.get("Items", []))
        if not page.get("LastEvaluatedKey"):
            return
        request["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def _own_keys(
    dynamodb: DynamoDBClient,
    items: Sequence[dict[str, Any]],
    registry: Registry,
    connection_id: str,
    session_id: str | None,
    deadline: Deadline,
) -> tuple[list[Any], int]:
    """The keys of the items that are this connection's memberships (and, with ``registry.session_attribute``, held
    by ``session_id``, as the table says: ``held_by``), and how many others the index returned."""
    keys = [key for key in (own_key(item, registry, connection_id) for item in items) if key is not None]
    if registry.session_attribute is not None and keys:
        keys = held_by(dynamodb, registry, keys, connection_id, session_id, deadline)
    return keys, len(items) - len(keys)


def own_key(item: dict[str, Any], registry: Registry, connection_id: str) -> dict[str, Any] | None:
    """``item``'s own key, if it is ``connection_id``'s membership: its connection-id attribute is exactly that id,
    and its key names it (see the module's docstring); None otherwise."""
    key = {name: item[name] for name in registry.keys if name in item}
    complete = len(key) == len(registry.keys)
    if complete and item.get(registry.attribute) == {"S": connection_id} and _names(key, connection_id):
        return key
    return None


def _names(key: dict[str, Any], connection_id: str) -> bool:
    """Whether a key attribute is ``connection_id``, or has it as a ``#``-separated part (``conn#<id>``)."""
    texts = [value["S"] for value in key.values() if isinstance(value, dict) and isinstance(value.get("S"), str)]
    return any(connection_id in text.split("#") for text in texts)


def _delete_all(
    dynamodb: DynamoDBClient, table: str, keys: list[Any], deadline: Deadline, permit: Gate, max_wait: float
) -> None:
    """Delete the memberships under ``keys`` (one BatchWriteItem), and again what DynamoDB leaves unprocessed."""
    pending: Sequence[WriteRequestTypeDef | WriteRequestOutputTypeDef] = [
        {"DeleteRequest": {"Key": key}} for key in keys
    ]

    def send() -> None:
        nonlocal pending
        pending = _delete(dynamodb, table, pending, keys, deadline, permit)
        if pending:
            raise Unprocessed(f"{len(pending)} memberships")

    def before_sleep(state: RetryCallState) -> None:
        why = f"the deadline came before {len(pending)} unprocessed memberships were sent again"
        _out_of_time(deadline, why, state.upcoming_sleep or 0.0)

    try:
        unprocessed_again(UNPROCESSED_TRIES, FIRST_WAIT_SECONDS, max_wait, before_sleep)(send)
    except RetryError:
        raise TransientError(
            f"BatchWriteItem: {len(pending)} memberships of {table!r} still unprocessed after {UNPROCESSED_TRIES} tries"
        ) from None


def _delete(
    dynamodb: DynamoDBClient,
    table: str,
    pending: Sequence[WriteRequestTypeDef | WriteRequestOutputTypeDef],
    keys: list[Any],
    deadline: Deadline,
    permit: Gate,
) -> list[WriteRequestTypeDef]:
    """One BatchWriteItem of ``pending``, its permit asked where it leaves; what DynamoDB left unprocessed."""
    with permit.sending(deadline):
        answer = call(dynamodb.batch_write_item, "BatchWriteItem", deadline, RequestItems={table: pending})
    if "UnprocessedItems" not in answer:  # always there, empty when all went: a garbled answer cannot tell
        raise TransientError(f"BatchWriteItem: an answer without UnprocessedItems for {table!r}: cannot tell")
    return _sent_again(answer["UnprocessedItems"], table, keys)


def _sent_again(unprocessed: Any, table: str, keys: list[Any]) -> list[WriteRequestTypeDef]:
    """The deletions DynamoDB left unprocessed, to send again: only of the keys sent, only as deletions. An answer
    naming anything else (another table, a put, a key not sent) is not DynamoDB's, and cannot tell what went."""
    garbled = TransientError(f"BatchWriteItem: an UnprocessedItems for {table!r} naming what was not sent")
    if not isinstance(unprocessed, dict) or set(unprocessed) - {table}:
        raise garbled
    sent = {_key_text(key): key for key in keys}
    again: list[WriteRequestTypeDef] = []
    for request in unprocessed.get(table) or []:
        key = request.get("DeleteRequest", {}).get("Key") if isinstance(request, dict) else None
        if set(request or {}) != {"DeleteRequest"} or _key_text(key) not in sent:
            raise garbled
        again.append({"DeleteRequest": {"Key": sent[_key_text(key)]}})
    return again


def _key_text(key: Any) -> str:
    return json.dumps(key, sort_keys=True, default=str)


def _out_of_time(deadline: Deadline, why: str, needed: float = 0.0) -> None:
    if deadline.remaining() <= needed:
        raise OutOfTimeError(why)


class Membership(ActionKind):
    """The room memberships of the session's connection, in REGISTRY_TABLE (none without it)."""

    name = ACTION
    reads = ("connection_id", "pk")
    names = ("connection_id",)
    paced_by = "dynamodb"

    def plan(self, session: Session, context: Context) -> Sequence[Step]:
        runtime = context.runtime
        table = runtime.settings.registry_table
        if not session.connection_id or not table:
            return []
        held = session.connection_id
        index = runtime.settings.registry_connection_index
        attribute = runtime.settings.attributes.registry_connection_id
        try:
            connection_id = connection_id_of(held, runtime.settings)
        except PermanentError as exc:
            return [self.step(held, {"connectionId": held, "table": table}, refusal=exc)]
        gate = self.gate(context, held)
        binding = runtime.settings.session_binding
        held_by = session_id_of(session.pk, runtime.settings)
        bound = binding is Binding.STRICT or (binding is Binding.OWN and held_by is not None)
        by_session = runtime.settings.attributes.registry_session_id if bound else None

        def where(deadline: Deadline) -> Registry:
            return Registry(table, index, attribute, runtime.table_keys(table, deadline), by_session)

        def run(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
            wait = runtime.settings.retry_max_wait_seconds
            dynamodb = runtime.clients.dynamodb
            try:
                pruned = prune(
                    dynamodb, where(deadline), connection_id, deadline, permit=gate, max_wait=wait, session_id=held_by
                )
            except NowHeldError as kept:
                return ActionStatus.KEPT, {"heldBy": "live session", "memberships": kept.deleted}
            return (ActionStatus.DONE if pruned.deleted else ActionStatus.ALREADY_DONE), _memberships(pruned)

        def preview(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
            found = count(runtime.clients.dynamodb, where(deadline), connection_id, deadline, held_by)
            return ActionStatus.PLANNED, _memberships(found)

        detail = {"connectionId": connection_id, "table": table, "index": index}
        return [self.step(held, detail, run=run, preview=preview)]

    def free_orphans(self, orphans: Sequence[Orphan], gate: Gate, host: Host, deadline: Deadline) -> ActionStatus:
        keys = [orphan.location for orphan in orphans if orphan.location is not None]
        remove(host.clients.dynamodb, self.settings.registry_table or "", keys, deadline, permit=gate)
        return ActionStatus.DONE  # BatchWriteItem cannot tell whether an item was there

    def holding(self, resource: str, live: Session, location: Any) -> Holding:
        # The memberships belong to the connection: a live session still on it keeps them too.
        return Holding.HELD if live.connection_id == resource else Holding.FREE

    def covering(self, resource: str, location: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
        table = self.settings.registry_table
        return ((), (f"dynamodb:{table}:",)) if table else ((), ())


def _memberships(pruned: Pruned) -> dict[str, Any]:
    return {"memberships": pruned.deleted, **({"kept": pruned.kept} if pruned.kept else {})}
