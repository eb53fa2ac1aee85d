"""The session item, as the worker reads it from a REMOVE record's OldImage, and where its scratch data lives."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict

from schemas.attributes import decode_image
from schemas.settings import AttributeNames


class SessionItemError(ValueError):
    """The image holds session attributes of the wrong type."""


class SessionShape(BaseModel):
    """What the enabled action kinds read of an item: ``resources``, the attributes that make an item a session (an
    item holding none is not one); ``extra``, the kinds' own attributes (not ``ATTR_*`` names), read by the fence and
    kept in messages."""

    model_config = ConfigDict(frozen=True)

    resources: tuple[str, ...]
    extra: tuple[str, ...] = ()

    @classmethod
    def built_in(cls, names: AttributeNames) -> SessionShape:
        """The built-in kinds' (a socket, a grant, a scratch prefix)."""
        return cls(resources=names.resources)


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
    extra: tuple[tuple[str, Any], ...] = ()
    """The attributes of ``own`` (an action kind's own, not ``ATTR_*``) the image holds, as decoded."""

    @classmethod
    def from_image(cls, image: dict[str, Any], names: AttributeNames, own: tuple[str, ...] = ()) -> Session:
        """Build from a decoded image, keeping the attributes of ``own`` too (``value``).

        Raises:
            SessionItemError: a session attribute has the wrong type (the message names it).
        """
        return cls(
            extra=tuple((name, image[name]) for name in own if name in image),
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

    @classmethod
    def decode(
        cls, image: dict[str, Any], names: AttributeNames, own: tuple[str, ...] = (), name: str = "Image"
    ) -> Session:
        """Build from an image in AttributeValue form, decoding only the attributes a session is built from.

        Raises:
            AttributeDecodeError: one of them is not a valid AttributeValue (the message names it).
            SessionItemError: one of them has the wrong type (the message names it).
        """
        return cls.from_image(decode_image(image, name, (*names.session, *own)), names, own)

    def value(self, name: str) -> Any:
        """The decoded value of an attribute of ``own`` (None when the image does not hold it)."""
        return dict(self.extra).get(name)


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
