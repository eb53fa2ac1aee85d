"""Checking integrity tags (:mod:`cleanup.queues.integrity`): what the readers of the worker's own messages, the drain
and redrive, import. Apart from the tagging, so that the stream's function, which only writes messages, holds no code
that verifies them (its role may not: VerifyMac is the drain's alone)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cleanup.aws.answers import missing
from cleanup.aws.calls import call_or_gone
from cleanup.deadline import Deadline
from cleanup.exceptions import IntegrityError
from cleanup.queues.integrity import ALGORITHM, FIELD, signed_bytes
from cleanup.telemetry import log

if TYPE_CHECKING:
    from cleanup.runtime import Runtime

_INVALID = frozenset({"KMSInvalidMacException"})


def verify(message: Mapping[str, Any], runtime: Runtime, deadline: Deadline | None = None) -> str:
    """Check the tag of a message the worker says it wrote: with INTEGRITY_KEY_ID, then with each of
    INTEGRITY_PREVIOUS_KEY_IDS (a message tagged before the key was rotated).

    Only KMS's own verdicts refuse: ``MacValid: false`` or ``KMSInvalidMacException``, from every key accepted. An
    answer that says neither (a 200 with an empty or cut body) tells nothing: it is a transient error, and the message
    is kept and tried again, never taken for a forgery.

    Returns:
        The key the tag verified with (INTEGRITY_KEY_ID, or a previous key: ``cleanup-worker retag`` tags it again).

    Raises:
        IntegrityError: no key to check with, no tag, or a tag that no accepted key verifies: nothing it names may be
            freed.
        TransientError / PermanentError: KMS could not answer now, or not understandably (the message is kept and
            tried again).
    """
    keys = runtime.settings.integrity_keys
    if not keys:
        raise IntegrityError("no INTEGRITY_KEY_ID is set to verify the message's integrity tag with")
    mac = _mac(message.get(FIELD))
    signed = signed_bytes(message)
    for key in keys:
        if _verifies(runtime, key, signed, mac, deadline):
            return key
    raise IntegrityError("the message's integrity tag does not verify: it is not as the worker wrote it")


def _verifies(runtime: Runtime, key: str, signed: bytes, mac: bytes, deadline: Deadline | None) -> bool:
    """KMS's verdict on ``mac`` with ``key``.

    Raises:
        TransientError: an answer that is no verdict (no boolean MacValid); or the call failed transiently.
        PermanentError: the call failed otherwise (a key disabled, access denied).
    """
    answer = call_or_gone(
        runtime.clients.kms.verify_mac,
        "VerifyMac",
        deadline,
        _INVALID,  # KMS's answer for a tag that does not match: not a failure of the call, a refusal
        KeyId=key,
        MacAlgorithm=ALGORITHM,
        Message=signed,
        Mac=mac,
    )
    if answer is None:
        return False
    valid = answer.get("MacValid")
    if not isinstance(valid, bool):
        raise missing("VerifyMac", ("MacValid",))
    return valid


def refused(runtime: Runtime, message_id: str, reason: str, error: str, where: str) -> None:
    """Count and log a message that is refused whole, and say what the operator does with it."""
    runtime.metrics.count("MessagesRefused", "Reason", reason)
    runtime.metrics.flush()  # a refusal may end the batch: no outcome follows to flush it
    log.error(
        f"message refused ({reason}); nothing it names was freed, and it is kept in {where}",
        extra={
            "messageId": message_id,
            "error": error,
            "todo": "inspect the message: if the worker wrote it with a key INTEGRITY_KEY_ID replaced, list that key "
            "in INTEGRITY_PREVIOUS_KEY_IDS and run cleanup-worker retag on the queue; if it lost its tag to an "
            "untagged upgrade, clean its session by hand; otherwise find who could send to the queue or write under "
            "DEAD_LETTER_PREFIX",
        },
    )


def _mac(tag: object) -> bytes:
    if not isinstance(tag, dict) or tag.get("algorithm") != ALGORITHM or not isinstance(tag.get("mac"), str):
        raise IntegrityError(f"the message carries no {ALGORITHM} integrity tag: the worker cannot vouch for it")
    try:
        mac = base64.b64decode(tag["mac"], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise IntegrityError("the message's integrity tag is not base64") from exc
    if not 1 <= len(mac) <= 6144:  # what KMS accepts as a Mac
        raise IntegrityError("the message's integrity tag has no usable length")
    return mac
