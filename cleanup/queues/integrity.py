"""Integrity tags: the worker frees what one of its own messages names only if it can vouch for the message.

A dead-letter or backlog message names a session's socket, grant and scratch prefix, and the drain and redrive act on
it. Anyone who can send to the queue, or write under DEAD_LETTER_PREFIX, could otherwise name a live session's
resources. So every such message the worker writes carries an ``integrity`` field: an HMAC (KMS GenerateMac,
HMAC_SHA_256, with the HMAC key INTEGRITY_KEY_ID) over the SHA-256 of the rest of the message, in canonical JSON
(sorted keys, no spaces, ASCII). A record too large for a message is stored in S3 as before; the message naming it
carries ``recordDigest``, the SHA-256 of the object's bytes, inside the tagged content. The drain and redrive verify
the tag (KMS VerifyMac, with the configured key, never one a message names) and the object's digest before anything
else (:mod:`cleanup.queues.integrity_check`, which only the readers import); a message or object that fails is refused
(:class:`IntegrityError`): nothing it names is freed, it is counted
(``MessagesRefused``), logged with what to do, and kept.

Why a KMS HMAC key: the secret never leaves KMS, so no role that can read the worker's configuration, code or logs can
make a tag; IAM says who may tag (GenerateMac: the functions that write messages) and who may only check (VerifyMac:
the drain and redrive's operator), and CloudTrail records both. Why a digest for the stored record: one KMS call
covers the message and its object together, and a tag over 1 MiB would need a digest anyway (KMS MACs at most 4 KiB).

A message written untagged (before INTEGRITY_KEY_ID was set, or without it) cannot be vouched for either: it is
refused like a forged one, and kept for an operator to inspect and redrive by hand.

KMS cannot rotate an HMAC key in place: a rotation is a new INTEGRITY_KEY_ID, the keys it replaced listed in
INTEGRITY_PREVIOUS_KEY_IDS, which verify a tag and never make one; ``cleanup-worker retag`` tags the messages in
flight again with the new key (:mod:`cleanup.operations.retag`).

A Lambda on-failure message carries no tag and needs none: it holds only a stream, a shard and a range of sequence
numbers, and redrive reads the records themselves again from SESSION_TABLE's stream (another stream is refused). A
forged range can only name records the stream really holds, each cleaned through the same fence as on its first
delivery.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Literal

from cleanup.aws.answers import missing, needed
from cleanup.aws.calls import call
from cleanup.deadline import Deadline
from cleanup.exceptions import IntegrityError

if TYPE_CHECKING:
    from cleanup.runtime import Runtime

FIELD = "integrity"
DIGEST_FIELD = "recordDigest"
ALGORITHM: Final[Literal["HMAC_SHA_256"]] = "HMAC_SHA_256"
TAG_BYTES = 120  # what the tag adds to a message, with room to spare: sizes are checked before it is added
_CONTEXT = b"session-cleanup.queues.integrity.v1\n"


def digest(data: bytes) -> str:
    """``sha256:<hex>`` of ``data``: how a tagged message names the bytes of its stored record."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def seal(body: str, runtime: Runtime, deadline: Deadline | None = None) -> str:
    """``body`` (a JSON object) with its integrity tag; as it is when no INTEGRITY_KEY_ID is set.

    Raises:
        TransientError / PermanentError: KMS could not tag it now, or answered without a tag (an empty or cut body):
            the record then stays failed, and is retried.
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
    mac = needed(answer, "GenerateMac", "Mac", kind=bytes)
    if not mac:
        raise missing("GenerateMac", ("Mac",))
    message[FIELD] = {"algorithm": ALGORITHM, "mac": base64.b64encode(mac).decode("ascii")}
    return json.dumps(message, default=str)


def check_digest(data: bytes, expected: object, where: str) -> None:
    """Check a stored record's bytes against the digest its (verified) message names.

    Raises:
        IntegrityError: no digest, or another one: the object was changed after the worker wrote it.
    """
    if not isinstance(expected, str) or digest(data) != expected:
        raise IntegrityError(f"the stored record {where} is not the one its message's integrity tag covers")


def signed_bytes(message: Mapping[str, Any]) -> bytes:
    """What the tag is made over: KMS MACs at most 4 KiB, so a digest of the whole message in canonical JSON (sorted
    keys, no spaces, ASCII), the tag itself left out."""
    content = {name: value for name, value in message.items() if name != FIELD}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return _CONTEXT + hashlib.sha256(text.encode("ascii")).hexdigest().encode("ascii")
