"""Tagging the worker's own messages again with the current integrity key, after a rotation.

KMS cannot rotate an HMAC key in place: a rotation is a new INTEGRITY_KEY_ID, the old key listed in
INTEGRITY_PREVIOUS_KEY_IDS, where it is accepted to verify and never to tag (``cleanup.queues.integrity_check``).
:func:`retag` takes one message of a backlog or dead-letter queue and says what becomes of it:

* ``current``: its tag verifies with INTEGRITY_KEY_ID already; it stays as it is;
* ``retagged``: its tag verifies with a previous key; the message, unchanged but for its tag (made with
  INTEGRITY_KEY_ID over the same content, a stored record's digest included), is to be sent in its place;
* ``untagged``: a Lambda on-failure message, which carries no tag and needs none; it stays as it is;
* ``refused``: no accepted key verifies it (or it carries no tag, or it is not a message at all): it stays, reported,
  for an operator to inspect as any refused message;
* ``error``: KMS could not answer now; it stays, and the next run tries it again.

Nothing a message names is read or freed here: only its tag is checked and made again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from cleanup.exceptions import CleanupError, IntegrityError
from cleanup.queues.deadletter import MESSAGE_FORMAT
from cleanup.queues.integrity import seal
from cleanup.queues.integrity_check import verify

if TYPE_CHECKING:
    from cleanup.runtime import Runtime


class Fate(StrEnum):
    """What becomes of one message."""

    CURRENT = "current"
    RETAGGED = "retagged"
    UNTAGGED = "untagged"
    REFUSED = "refused"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Retag:
    """One message's fate; ``body`` is the message to send in its place (``retagged`` only)."""

    fate: Fate
    body: str | None = None
    why: str | None = None


ON_FAILURE = ("DDBStreamBatchInfo", "KinesisBatchInfo", "Type")  # an on-failure message, or one in an SNS envelope


def retag(body: str, runtime: Runtime) -> Retag:
    """What becomes of the message ``body`` (see the module's docstring). Never raises for a bad message."""
    try:
        message = json.loads(body)
    except (ValueError, RecursionError) as exc:
        return Retag(Fate.REFUSED, why=f"not JSON: {exc}")
    if not isinstance(message, dict):
        return Retag(Fate.REFUSED, why="not a JSON object")
    if message.get("format") != MESSAGE_FORMAT:
        if any(name in message for name in ON_FAILURE):
            return Retag(Fate.UNTAGGED, why="an on-failure message: it carries no tag and needs none")
        return Retag(Fate.REFUSED, why="neither the worker's message nor an on-failure message")
    try:
        key = verify(message, runtime)
        if key == runtime.settings.integrity_key_id:
            return Retag(Fate.CURRENT)
        return Retag(Fate.RETAGGED, seal(body, runtime), why=f"tagged with {key}")
    except IntegrityError as exc:
        return Retag(Fate.REFUSED, why=f"integrity: {exc}")
    except CleanupError as exc:
        return Retag(Fate.ERROR, why=str(exc))
