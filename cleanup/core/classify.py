"""Classification: is this record a session to clean, and why was it deleted?

Only SESSION_TABLE's items are sessions. A record names its table (a DynamoDB stream's through ``eventSourceARN``,
a Kinesis data stream's through ``tableName``), but a replayed file or a redriven message may name any: a record is a
session only when the table it names is SESSION_TABLE, and cannot be judged at all without SESSION_TABLE (the Lambda
handler sets it to its mapping's table when the environment leaves it unset). The connection registry's items carry a
connection id too, and are never sessions, whatever stream brings them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cleanup.core.region import here as this_region
from cleanup.core.region import home
from cleanup.exceptions import BadRecordError
from schemas.attributes import AttributeDecodeError
from schemas.outcomes import Reason
from schemas.records import Source, StreamRecord
from schemas.session import Session, SessionItemError, SessionShape
from schemas.settings import Settings

if TYPE_CHECKING:
    from cleanup.core.process import Configured

NO_OLD_IMAGE = (
    "REMOVE record has no OldImage (stream view type {view}): there is nothing to clean up from. "
    "Set the table's StreamViewType to NEW_AND_OLD_IMAGES (or OLD_IMAGE); records already in the stream stay unusable."
)


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with one record. ``session`` is set when it must be cleaned."""

    key: str
    session: Session | None = None
    reason: Reason | None = None
    skip_reason: str | None = None
    ttl_lag_seconds: float | None = None
    elsewhere: str | None = None
    """GLOBAL_TABLE: the region that owns the session, when it is not this one (the record is skipped)."""


def item_key(record: StreamRecord) -> str:
    """A stable text form of the item's table and key, used for ordering and in logs."""
    keys = ",".join(f"{name}={_key_text(value)}" for name, value in sorted(record.keys.items()))
    return f"{record.table or '-'}:{keys}"


def _key_text(value: Any) -> str:
    if isinstance(value, dict) and len(value) == 1:
        ((_, text),) = value.items()
        return str(text)
    return json.dumps(value, sort_keys=True, default=str)


def classify_here(record: StreamRecord, runtime: Configured) -> Decision:
    """``classify`` with the runtime's settings and, with GLOBAL_TABLE, the region it cleans for.

    Raises:
        BadRecordError: as ``classify``.
        MissingConfigError: GLOBAL_TABLE is on and the clients' region is not a region's name.
    """
    return classify(record, runtime.settings, this_region(runtime), runtime.shape)


def classify(
    record: StreamRecord, settings: Settings, here: str | None = None, shape: SessionShape | None = None
) -> Decision:
    """Decide whether ``record`` is a deleted session to clean, and its reason.

    ``here``: this worker's region with GLOBAL_TABLE (``cleanup.core.region``): a session another region owns is
    skipped. ``shape``: what the enabled kinds read (None: the built-ins'): an item holding none of its resources is
    no session.

    Raises:
        BadRecordError: a REMOVE without OldImage, or an image that cannot be decoded; with ``here``, an item that
            tells no region or several (``cleanup.core.region.home``).
    """
    key = item_key(record)
    if record.event_name != "REMOVE":
        return Decision(key, skip_reason=f"event {record.event_name or 'unknown'} is not a REMOVE")
    other_table = _other_table(record, settings)
    if other_table is not None:
        return Decision(key, skip_reason=other_table)
    if record.old_image is None:
        raise BadRecordError(NO_OLD_IMAGE.format(view=record.stream_view_type or "unknown"))
    names = settings.attributes
    not_by_key = not_a_session_key({names.pk: _partition_key_value(record, names.pk), **record.keys}, settings)
    if not_by_key is not None:
        return Decision(key, skip_reason=not_by_key)
    shape = shape or SessionShape.built_in(names)
    if not any(name in record.old_image for name in shape.resources):
        return Decision(key, skip_reason="not a session: the old image has none of the session attributes")
    try:
        session = Session.decode(record.old_image, names, shape.extra, "OldImage")
    except (AttributeDecodeError, SessionItemError) as exc:
        raise BadRecordError(str(exc)) from exc
    _check_keys(record, record.old_image)
    if here is not None:
        owner = home(session, record.old_image, settings, here)
        if owner != here:
            return Decision(key, skip_reason=f"another region's session: {owner} owns it, not {here}", elsewhere=owner)
    reason, lag = _reason(record, session)
    return Decision(key, session=session, reason=reason, ttl_lag_seconds=lag)


def _check_keys(record: StreamRecord, old_image: dict[str, Any]) -> None:
    """The race check reads the live item under ``Keys``, and the actions free what ``OldImage`` holds: they must be
    the same item. A stream never sends them apart; a hand-made record (a replayed file, a message) can.

    Raises:
        BadRecordError: ``Keys`` is empty, or names a value the old image does not have.
    """
    if not record.keys:
        raise BadRecordError("record has no Keys: the item under which a reconnected session would live is unknown")
    differing = sorted(name for name, value in record.keys.items() if old_image.get(name) != value)
    if differing:
        raise BadRecordError(f"record's Keys and OldImage differ on {', '.join(differing)}: they are not one item")


def _other_table(record: StreamRecord, settings: Settings) -> str | None:
    """Why ``record`` is not an item of SESSION_TABLE (None: it is, as far as it says).

    A record naming no table is taken as SESSION_TABLE's when it comes from a DynamoDB stream (a GetRecords response
    names none): the race check reads SESSION_TABLE under its keys, whatever the record says.

    Raises:
        BadRecordError: SESSION_TABLE is not set, so whose item the record is cannot be trusted; or a Kinesis record
            names no table.
    """
    table = record.table
    if table is not None and table == settings.registry_table:
        return f"not a session: an item of the registry table {table!r}"
    if settings.session_table is None:
        raise BadRecordError(
            f"record of table {table or 'unnamed'!r} and SESSION_TABLE is not set: a record's own table is not "
            "trusted (a replayed file or a message may name any), so set SESSION_TABLE to the table that holds the "
            "sessions"
        )
    if table is None and record.source is Source.KINESIS:
        raise BadRecordError("Kinesis record names no table (tableName): whose item it is cannot be told")
    if table is not None and table != settings.session_table:
        return f"not a session: an item of table {table!r}, not of SESSION_TABLE {settings.session_table!r}"
    return None


def not_a_session_key(keys: dict[str, Any], settings: Settings) -> str | None:
    """Why an item of these keys (AttributeValue form) is not a session by SESSION_KEY_PREFIX and SESSION_SORT_KEY;
    None when it may be one. The stream's records and the sweeper's index entries are judged alike."""
    names = settings.attributes
    prefix = settings.session_key_prefix
    partition = keys.get(names.pk)
    partition_text = partition["S"] if isinstance(partition, dict) and isinstance(partition.get("S"), str) else ""
    if prefix and not partition_text.startswith(prefix):
        return f"not a session: partition key outside {prefix!r}"
    sort_key = settings.session_sort_key
    sort_value = keys.get(names.sk)
    if sort_key is not None and (_key_text(sort_value) if sort_value is not None else None) != sort_key:
        return f"not a session: sort key is not {sort_key!r}"
    return None


def _partition_key_value(record: StreamRecord, name: str) -> Any:
    return record.keys.get(name) or (record.old_image or {}).get(name)


def _reason(record: StreamRecord, session: Session) -> tuple[Reason, float | None]:
    lag = None
    if session.ttl is not None and record.created_at is not None:
        lag = record.created_at - session.ttl
    if record.user_identity is not None and record.user_identity.is_ttl_service:
        return Reason.TTL, lag
    if lag is not None and lag >= 0:
        return Reason.EXPIRED, None
    return Reason.EXPLICIT, None
