"""Where things are in a JSON text, by line: so that a record read from a one-document file is named by the line it
starts on (``cleanup.operations.sources``), not only by its position in its array.
"""

from __future__ import annotations

import json


def first_char(text: str) -> int:
    """The offset of ``text``'s first character that is not white space."""
    return len(text) - len(text.lstrip())


def line_at(text: str, offset: int) -> int:
    """The line (from 1) ``offset`` lies on."""
    return text.count("\n", 0, offset) + 1


def element_lines(text: str | None, key: str, count: int) -> list[int] | None:
    """The line each element of the top-level array ``key`` starts on (``text`` is known to be valid JSON)."""
    if text is None:
        return None
    decoder = json.JSONDecoder()
    at = _skip(text, first_char(text) + 1)  # past the opening brace
    while at < len(text) and text[at] != "}":
        name, at = decoder.raw_decode(text, at)
        at = _skip(text, _skip(text, at) + 1)  # past the colon
        if name == key and text[at] == "[":
            offsets = _array_offsets(decoder, text, at)
            return [line_at(text, offset) for offset in offsets] if len(offsets) == count else None
        _, at = decoder.raw_decode(text, at)
        at = _skip(text, at)
        if text[at] == ",":
            at = _skip(text, at + 1)
    return None


def _array_offsets(decoder: json.JSONDecoder, text: str, at: int) -> list[int]:
    offsets = []
    at = _skip(text, at + 1)
    while text[at] != "]":
        offsets.append(at)
        _, at = decoder.raw_decode(text, at)
        at = _skip(text, at)
        if text[at] == ",":
            at = _skip(text, at + 1)
    return offsets


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at
