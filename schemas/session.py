"""The session item, as the worker reads it from a REMOVE record's OldImage, and where its scratch data lives."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict

from schemas.settings import AttributeNames


class SessionItemError(ValueError):
    """The image holds session attributes of the wrong type."""


class Session(BaseModel):
    """A session's resources: what must be freed when its item is deleted."""

    model_config = ConfigDict(frozen=True)

    pk: str | None = None
    sk: str | None = None
    connection_id: str | None = None
    scratch_prefix: str | None = None
    grant_id: str | None = None
    tenant_id: str | None = None
    ttl: int | None = None
    kms_key_id: str | None = None
    callback_url: str | None = None

    @classmethod
    def from_image(cls, image: dict[str, Any], names: AttributeNames) -> Session:
        """Build from a decoded image.

        Raises:
            SessionItemError: a session attribute has the wrong type (the message names it).
        """
        return cls(
            pk=_key(image, names.pk),
            sk=_key(image, names.sk),
            connection_id=_text(image, names.connection_id),
            scratch_prefix=_text(image, names.scratch_prefix),
            grant_id=_text(image, names.grant_id),
            tenant_id=_text(image, names.tenant_id),
            ttl=_epoch(image, names.ttl),
            kms_key_id=_text(image, names.kms_key_id),
            callback_url=_text(image, names.callback_url),
        )


def _text(image: dict[str, Any], name: str) -> str | None:
    value = image.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise SessionItemError(f"attribute {name}: expected a string (S), got {type(value).__name__}")
    return value


def _key(image: dict[str, Any], name: str) -> str | None:
    value = image.get(name)
    if value is None or isinstance(value, str):
        return value
    return str(value)  # numeric or binary keys are logged in text form only


def _epoch(image: dict[str, Any], name: str) -> int | None:
    value = image.get(name)
    if value is None:
        return None
    if not isinstance(value, Decimal):
        raise SessionItemError(f"attribute {name}: expected a number (N) of epoch seconds, got {type(value).__name__}")
    return int(value)
