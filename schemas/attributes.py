"""DynamoDB AttributeValue decoding, strict.

Decodes the JSON form of an AttributeValue (as DynamoDB Streams, Lambda and Kinesis deliver it: binary values are
base64 strings) into Python values equal to what boto3's ``TypeDeserializer`` returns for the same valid input:
``S`` -> str, ``N`` -> Decimal, ``B`` -> bytes, ``SS``/``NS``/``BS`` -> set, ``BOOL`` -> bool, ``NULL`` -> None,
``M`` -> dict, ``L`` -> list.

Unlike boto3 it rejects what DynamoDB could never have stored: a number that is not finite or that exceeds DynamoDB's
38 digits of precision or its exponent range, a malformed base64 string, a type tag it does not know, an empty or
duplicated set. The error names the attribute path (``OldImage.meta.tags[2]``) so the failing record says why.

The worker decodes only the attributes it reads (``decode_image``'s ``attributes``), so an item's other attributes
cost nothing and cannot fail its record. Numbers are checked by syntax and then built with ``Decimal(str)``, which is
exact.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Collection, Mapping
from decimal import Decimal
from typing import Any, TypeVar

__all__ = ["AttributeDecodeError", "decode_image", "decode_number", "decode_value"]

# DynamoDB numbers: up to 38 significant digits, magnitude from 1E-130 to 9.99..E+125 (or zero).
MAX_DIGITS = 38
MIN_ADJUSTED_EXPONENT = -130
MAX_ADJUSTED_EXPONENT = 125

_T = TypeVar("_T")
_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


class AttributeDecodeError(ValueError):
    """An AttributeValue that DynamoDB could not have produced; ``path`` names the attribute."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"attribute {path}: {message}")
        self.path = path
        self.message = message


def decode_number(text: object, path: str = "N") -> Decimal:
    """Decode the text of an ``N`` value into an exact Decimal within DynamoDB's precision and range."""
    if type(text) is not str or _NUMBER.fullmatch(text) is None:
        raise AttributeDecodeError(path, f"not a number: {text!r}")
    value = Decimal(text)
    if value:
        digits = value.as_tuple().digits
        # Trailing zeros are not significant: DynamoDB stores 1E+39 and may render it with all its zeros.
        significant = len(digits)
        while digits[significant - 1] == 0:
            significant -= 1
        if significant > MAX_DIGITS:
            raise AttributeDecodeError(path, f"more than {MAX_DIGITS} significant digits: {text!r}")
        if not MIN_ADJUSTED_EXPONENT <= value.adjusted() <= MAX_ADJUSTED_EXPONENT:
            raise AttributeDecodeError(path, f"outside DynamoDB's number range: {text!r}")
    return value


def _decode_binary(text: object, path: str) -> bytes:
    if isinstance(text, bytes | bytearray):
        return bytes(text)
    if type(text) is not str:
        raise AttributeDecodeError(path, f"binary value is not a base64 string: {type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AttributeDecodeError(path, "binary value is not valid base64") from exc


def _string(value: object, path: str) -> str:
    if type(value) is not str:
        raise AttributeDecodeError(path, f"S value is not a string: {type(value).__name__}")
    return value


def _bool(value: object, path: str) -> bool:
    if type(value) is not bool:
        raise AttributeDecodeError(path, f"BOOL value is not true or false: {value!r}")
    return value


def _null(value: object, path: str) -> None:
    if value is not True:
        raise AttributeDecodeError(path, f"NULL value must be true: {value!r}")


def _members(value: object, path: str, tag: str) -> list[Any]:
    if type(value) is not list or not value:
        raise AttributeDecodeError(path, f"{tag} must be a non-empty list")
    return value


def _string_set(value: object, path: str) -> set[str]:
    members = _members(value, path, "SS")
    result = {_string(member, f"{path}[{i}]") for i, member in enumerate(members)}
    return _unique(result, members, path, "SS")


def _number_set(value: object, path: str) -> set[Decimal]:
    members = _members(value, path, "NS")
    result = {decode_number(member, f"{path}[{i}]") for i, member in enumerate(members)}
    return _unique(result, members, path, "NS")


def _binary_set(value: object, path: str) -> set[bytes]:
    members = _members(value, path, "BS")
    result = {_decode_binary(member, f"{path}[{i}]") for i, member in enumerate(members)}
    return _unique(result, members, path, "BS")


def _unique(result: set[_T], members: list[Any], path: str, tag: str) -> set[_T]:
    if len(result) != len(members):
        raise AttributeDecodeError(path, f"{tag} contains duplicate members")
    return result


def _map(value: object, path: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise AttributeDecodeError(path, "M value is not an object")
    return {name: decode_value(member, f"{path}.{name}") for name, member in value.items()}


def _list(value: object, path: str) -> list[Any]:
    if type(value) is not list:
        raise AttributeDecodeError(path, "L value is not a list")
    return [decode_value(member, f"{path}[{i}]") for i, member in enumerate(value)]


_DECODERS: dict[str, Callable[[Any, str], Any]] = {
    "S": _string,
    "N": decode_number,
    "B": _decode_binary,
    "BOOL": _bool,
    "NULL": _null,
    "M": _map,
    "L": _list,
    "SS": _string_set,
    "NS": _number_set,
    "BS": _binary_set,
}


def decode_value(attribute: object, path: str = "value") -> Any:
    """Decode one AttributeValue (``{"S": "x"}``) into its Python value.

    Raises:
        AttributeDecodeError: the value is not a valid AttributeValue; the message names ``path``.
    """
    if type(attribute) is not dict or len(attribute) != 1:
        raise AttributeDecodeError(path, f"expected an object with exactly one type tag, got {attribute!r:.80}")
    ((tag, value),) = attribute.items()
    decoder = _DECODERS.get(tag)
    if decoder is None:
        raise AttributeDecodeError(path, f"unknown attribute type {tag!r}")
    return decoder(value, path)


def decode_image(
    image: Mapping[str, Any], name: str = "Image", attributes: Collection[str] | None = None
) -> dict[str, Any]:
    """Decode an item image (``Keys``, ``OldImage``, ``NewImage``) into a plain dict: only the ``attributes`` named
    (those the reader reads: the others are neither decoded nor judged), or all of them (None).

    Raises:
        AttributeDecodeError: a decoded attribute is malformed; the message names ``<name>.<attribute>``.
    """
    if not isinstance(image, Mapping):
        raise AttributeDecodeError(name, "image is not an object")
    wanted = image.keys() if attributes is None else [attr for attr in attributes if attr in image]
    return {attr: decode_value(image[attr], f"{name}.{attr}") for attr in wanted}
