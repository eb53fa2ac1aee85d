"""Reading the live items of the session table: the item now stored under each deleted session's key, in one
consistent BatchGetItem for many records (``read_live_items``), decoded as the session it holds.

The fence (``cleanup.core.fence``) is handed these readings: it never reads by itself. The read goes to this region's
table; on a global table it is strongly consistent only with the writes made in this region, which is why there a
session is cleaned only in the region that owns it (``cleanup.core.region``, GLOBAL_TABLE).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from tenacity import RetryCallState, RetryError, Retrying

from cleanup.aws.calls import call
from cleanup.aws.coalesce import Part
from cleanup.aws.pacing import CONNECT_TIMEOUT_SECONDS, MIN_READ_SECONDS
from cleanup.aws.retry import Unprocessed, unprocessed_again
from cleanup.deadline import Deadline
from cleanup.exceptions import BadRecordError, CleanupError, OutOfTimeError, PermanentError, TransientError
from schemas.attributes import AttributeDecodeError
from schemas.session import Session, SessionItemError
from schemas.settings import AttributeNames

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import KeysAndAttributesTypeDef


BATCH_KEYS = 100  # BatchGetItem's limit
SAFETY_SECONDS = CONNECT_TIMEOUT_SECONDS + MIN_READ_SECONDS  # what a call needs after the wait
UNPROCESSED_ROUNDS = 8  # BatchGetItem calls for the keys DynamoDB left unprocessed, backing off, within the deadline
UNPROCESSED_BACKOFF_SECONDS = (0.05, 1.0)  # the first wait, and the longest


def read_live_items(
    dynamodb: DynamoDBClient,
    table: str,
    parts: list[Part[dict[str, Any], Session | None]],
    names: AttributeNames,
    deadline: Deadline,
    extra: tuple[str, ...] = (),
) -> None:
    """Answer each part (an item key, in client form) with the item now under it in ``table``, or None if none.

    One consistent BatchGetItem for at most BATCH_KEYS keys (parts naming the same key share it), and again for the
    keys DynamoDB leaves unprocessed, backing off, within ``deadline``. A request that fails for good while carrying
    several keys (one hostile key fails a whole BatchGetItem) is made again key by key, so that only the part whose
    key is at fault fails.

    ``extra``: attributes read besides the session's resources (the enabled kinds' own, ``Session.value``; reconcile
    reads ``ttl`` too).

    Parts are answered with ``Part.fail``: TransientError / PermanentError when the read failed, BadRecordError when
    the live item's session attributes cannot be read (nothing may then be freed).
    """
    by_key: dict[str, list[Part[dict[str, Any], Session | None]]] = {}
    for part in parts:
        by_key.setdefault(key_id(part.item), []).append(part)
    try:
        _read(dynamodb, table, by_key, names, deadline, extra)
    except PermanentError:
        if len(by_key) == 1:
            raise
        for one in by_key.values():
            try:
                _read(dynamodb, table, {key_id(one[0].item): one}, names, deadline, extra)
            except CleanupError as exc:
                for part in one:
                    part.fail(exc)


def _read(
    dynamodb: DynamoDBClient,
    table: str,
    by_key: dict[str, list[Part[dict[str, Any], Session | None]]],
    names: AttributeNames,
    deadline: Deadline,
    extra: tuple[str, ...] = (),
) -> None:
    key_names = sorted({name for parts in by_key.values() for name in parts[0].item})
    resources = [names.connection_id, names.grant_id, names.scratch_prefix, names.tenant_id]
    wanted = dict.fromkeys([*key_names, *resources, *extra])
    aliases = {f"#a{i}": name for i, name in enumerate(wanted)}
    projection = ", ".join(aliases)
    pending = {ident: parts[0].item for ident, parts in by_key.items()}

    def ask() -> None:
        keys: KeysAndAttributesTypeDef = {
            "Keys": list(pending.values()),
            "ConsistentRead": True,
            "ProjectionExpression": projection,
            "ExpressionAttributeNames": aliases,
        }
        response = call(dynamodb.batch_get_item, "BatchGetItem", deadline, RequestItems={table: keys})
        unmatched = False
        for item in _items(response, table):
            ident = key_id({name: item[name] for name in key_names if name in item})
            if pending.pop(ident, None) is None:
                unmatched = True  # an answer for no key asked: which key it answers is unknown, so none is trusted
                continue
            _answer(by_key[ident], item, names, extra)
        unprocessed = _unprocessed(response, table)
        for ident in [ident for ident in pending if ident not in unprocessed]:
            missing = TransientError("BatchGetItem answered an item that matches no key asked; nothing is freed")
            for part in by_key.pop(ident):
                if unmatched:
                    part.fail(missing)
                else:
                    part.answer(None)
            del pending[ident]
        if pending:
            raise Unprocessed(f"{len(pending)} keys")

    try:
        _unprocessed_again(deadline, lambda: len(pending))(ask)
    except RetryError:
        raise TransientError(
            f"BatchGetItem: {len(pending)} keys still unprocessed after {UNPROCESSED_ROUNDS} calls"
        ) from None


def _unprocessed_again(deadline: Deadline, left: Callable[[], int]) -> Retrying:
    """Asking again while keys are left unprocessed: UNPROCESSED_ROUNDS calls at most, never into the time a last call
    needs before ``deadline``."""

    def before_sleep(state: RetryCallState) -> None:
        if deadline.remaining() <= (state.upcoming_sleep or 0.0) + SAFETY_SECONDS:
            raise OutOfTimeError(f"BatchGetItem: {left()} keys unprocessed and no time left to ask again")

    return unprocessed_again(UNPROCESSED_ROUNDS, *UNPROCESSED_BACKOFF_SECONDS, before_sleep)


def _items(response: Mapping[str, Any], table: str) -> list[dict[str, Any]]:
    """The items a BatchGetItem answer holds for ``table``; an answer that does not name the table under
    ``Responses`` (a truncated body read as ``{}``, a garbled one) cannot tell whether a session is live."""
    responses = response.get("Responses")
    items = responses.get(table) if isinstance(responses, Mapping) else None
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise TransientError(f"BatchGetItem answered without {table!r} under Responses: cannot tell; nothing is freed")
    return items


def _unprocessed(response: Mapping[str, Any], table: str) -> dict[str, Any]:
    """The keys of ``table`` DynamoDB left unprocessed, by ``key_id``; a garbled entry cannot tell which keys are."""
    left = response.get("UnprocessedKeys") or {}
    keys = left.get(table, {}).get("Keys", []) if isinstance(left, Mapping) else None
    if not isinstance(keys, list) or not all(isinstance(key, dict) for key in keys):
        raise TransientError(f"BatchGetItem answered a garbled UnprocessedKeys for {table!r}: cannot tell")
    return {key_id(key): key for key in keys}


def _answer(
    parts: list[Part[dict[str, Any], Session | None]], item: dict[str, Any], names: AttributeNames, own: tuple[str, ...]
) -> None:
    try:
        live = Session.decode(item, names, own, "LiveItem")
    except (AttributeDecodeError, SessionItemError) as exc:
        unreadable = BadRecordError(f"live item under the same key is unreadable: {exc}")
        for part in parts:
            part.fail(unreadable)
        return
    for part in parts:
        part.answer(live)


def key_id(keys: dict[str, Any]) -> str:
    """An item key (client form, or as a response carries it) as text equal for equal keys: numbers compared by
    value (``1.50`` is ``1.5``), binary by its bytes."""
    canonical = {}
    for name, value in keys.items():
        if isinstance(value, dict) and len(value) == 1:
            ((kind, raw),) = value.items()
            if kind == "N" and isinstance(raw, str):
                raw = _number(raw)
            elif isinstance(raw, bytes | bytearray):
                raw = base64.b64encode(raw).decode()
            value = {kind: raw}
        canonical[name] = value
    return json.dumps(canonical, sort_keys=True, default=str)


def _number(text: str) -> str:
    try:
        return str(Decimal(text).normalize())
    except (InvalidOperation, ValueError):
        return text


def client_keys(keys: dict[str, Any]) -> dict[str, Any]:
    """Stream-record keys (binary as base64 text) in the form boto3's client sends (binary as bytes)."""
    converted = {}
    for name, value in keys.items():
        if isinstance(value, dict) and isinstance(value.get("B"), str):
            value = {"B": base64.b64decode(value["B"])}
        converted[name] = value
    return converted
