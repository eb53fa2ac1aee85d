"""Integrity tags: the worker frees what one of its own messages names only if it can vouch for the message.

A dead-letter or backlog message names a session's socket, grant and scratch prefix, and the drain and redrive act on
it. Anyone who can send to the queue, or write under DEAD_LETTER_PREFIX, could otherwise name a live session's
resources. So every such message the worker writes carries an ``integrity`` field: an HMAC (KMS GenerateMac,
HMAC_SHA_256, with the HMAC key INTEGRITY_KEY_ID) over the SHA-256 of the rest of the message, in canonical JSON
(sorted keys, no spaces, ASCII). A record too large for a message is stored in S3 as before; the message naming it
carries ``recordDigest``, the SHA-256 of the object's bytes, inside the tagged content. The drain and redrive verify
the tag (KMS VerifyMac, with the configured key, never one a message names) and the object's digest before anything
else; a message or object that fails is refused (:class:`IntegrityError`): nothing it names is freed, it is counted
(``MessagesRefused``), logged with what to do, and kept.

Why a KMS HMAC key: the secret never leaves KMS, so no role that can read the worker's configuration, code or logs can
make a tag; IAM says who may tag (GenerateMac: the functions that write messages) and who may only check (VerifyMac:
the drain and redrive's operator), and CloudTrail records both. Why a digest for the stored record: one KMS call
covers the message and its object together, and a tag over 1 MiB would need a digest anyway (KMS MACs at most 4 KiB).

A message written untagged (before INTEGRITY_KEY_ID was set, or without it) cannot be vouched for either: it is
refused like a forged one, and kept for an operator to inspect and redrive by hand.

A Lambda on-failure message carries no tag and needs none: it holds only a stream, a shard and a range of sequence
numbers, and redrive reads the records themselves again from SESSION_TABLE's stream (another stream is refused). A
forged range can only name records the stream really holds, each cleaned through the same fence as on its first
delivery.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Literal

from cleanup.aws.calls import call, call_or_gone
from cleanup.aws.retry import Deadline
from cleanup.exceptions import IntegrityError
from cleanup.telemetry import log

if TYPE_CHECKING:
    from cleanup.runtime import Runtime

FIELD = "integrity"
DIGEST_FIELD = "recordDigest"
ALGORITHM: Final[Literal["HMAC_SHA_256"]] = "HMAC_SHA_256"
TAG_BYTES = 120  # what the tag adds to a message, with room to spare: sizes are checked before it is added
_CONTEXT = b"session-cleanup.integrity.v1\n"
_INVALID = frozenset({"KMSInvalidMacException"})


def digest(data: bytes) -> str:
    """``sha256:<hex>`` of ``data``: how a tagged message names the bytes of its stored record."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def seal(body: str, runtime: Runtime, deadline: Deadline | None = None) -> str:
    """``body`` (a JSON object) with its integrity tag; as it is when no INTEGRITY_KEY_ID is set.

    Raises:
        TransientError / PermanentError: KMS could not tag it now (the record then stays failed, and is retried).
    """
    key = runtime.settings.integrity_key_id
    if not key:
        return body
    message = json.loads(body)
    answer = call(
        runtime.clients.kms.generate_mac,
        "GenerateMac",
        deadline,
        KeyId=key,
        MacAlgorithm=ALGORITHM,
        Message=signed_bytes(message),
    )
    message[FIELD] = {"algorithm": ALGORITHM, "mac": base64.b64encode(answer["Mac"]).decode("ascii")}
    return json.dumps(message, default=str)


def verify(message: Mapping[str, Any], runtime: Runtime, deadline: Deadline | None = None) -> None:
    """Check the tag of a message the worker says it wrote, with INTEGRITY_KEY_ID.

    Raises:
        IntegrityError: no key to check with, no tag, or a tag that does not verify: nothing it names may be freed.
        TransientError / PermanentError: KMS could not answer now (the message is kept and tried again).
    """
    key = runtime.settings.integrity_key_id
    if not key:
        raise IntegrityError("no INTEGRITY_KEY_ID is set to verify the message's integrity tag with")
    mac = _mac(message.get(FIELD))
    answer = call_or_gone(
        runtime.clients.kms.verify_mac,
        "VerifyMac",
        deadline,
        _INVALID,  # KMS's answer for a tag that does not match: not a failure of the call, a refusal
        KeyId=key,
        MacAlgorithm=ALGORITHM,
        Message=signed_bytes(message),
        Mac=mac,
    )
    if answer is None or answer.get("MacValid") is not True:
        raise IntegrityError("the message's integrity tag does not verify: it is not as the worker wrote it")


def check_digest(data: bytes, expected: object, where: str) -> None:
    """Check a stored record's bytes against the digest its (verified) message names.

    Raises:
        IntegrityError: no digest, or another one: the object was changed after the worker wrote it.
    """
    if not isinstance(expected, str) or digest(data) != expected:
        raise IntegrityError(f"the stored record {where} is not the one its message's integrity tag covers")


def refused(runtime: Runtime, message_id: str, reason: str, error: str, where: str) -> None:
    """Count and log a message that is refused whole, and say what the operator does with it."""
    runtime.metrics.count("MessagesRefused", "Reason", reason)
    runtime.metrics.flush()  # a refusal may end the batch: no outcome follows to flush it
    log.error(
        f"message refused ({reason}); nothing it names was freed, and it is kept in {where}",
        extra={
            "messageId": message_id,
            "error": error,
            "todo": "inspect the message: if the worker wrote it (a tag lost to an untagged upgrade or a changed "
            "INTEGRITY_KEY_ID), clean its session by hand or tag it again; otherwise find who could send to the "
            "queue or write under DEAD_LETTER_PREFIX",
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


def signed_bytes(message: Mapping[str, Any]) -> bytes:
    """What the tag is made over: KMS MACs at most 4 KiB, so a digest of the whole message in canonical JSON (sorted
    keys, no spaces, ASCII), the tag itself left out."""
    content = {name: value for name, value in message.items() if name != FIELD}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return _CONTEXT + hashlib.sha256(text.encode("ascii")).hexdigest().encode("ascii")
