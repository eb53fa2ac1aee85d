"""Identifiers in logs: with LOG_IDENTIFIERS=hashed, the fields that name a session's resources
(``IDENTIFIER_FIELDS``, at any depth) are logged as ``hmac:<16 hex>``, an HMAC-SHA256 under LOG_HASH_KEY (or a key
derived from the deployment's names), and every text of the same line (a message, an error, a traceback) has the same
values replaced by the same hashes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Callable
from typing import Any

from schemas.settings import LogIdentifiers, Settings

IDENTIFIER_FIELDS = frozenset(
    {
        "connectionId",
        "grantId",
        "keyId",
        "bucket",
        "prefix",
        "scratchPrefix",
        "key",
        "tenantId",
        "sessionId",
        "id",
        "membership",
    }
)
"""Log fields that name a session's resources, its item or its tenant: hashed with LOG_IDENTIFIERS=hashed."""
SHORT = 4  # a value shorter than this is replaced in a text only where it is quoted: it could be part of any word

Hasher = Callable[[str], str]


def identifier_hasher(settings: Settings) -> Hasher | None:
    """What a logged identifier becomes with LOG_IDENTIFIERS=hashed (None: logged as it is)."""
    if settings.log_identifiers is not LogIdentifiers.HASHED:
        return None
    if settings.log_hash_key is not None:
        key = settings.log_hash_key.get_secret_value().encode()
    else:  # the same in every function and process of a deployment, and differs between deployments
        names = (settings.service_name, settings.session_table, settings.kms_key_id, settings.scratch_bucket)
        key = hashlib.sha256("\0".join(["log identifiers", *(name or "" for name in names)]).encode()).digest()

    def hashed(value: str) -> str:
        return "hmac:" + hmac.new(key, value.encode(), hashlib.sha256).hexdigest()[:16]

    return hashed


def hide_identifiers(line: dict[str, Any], hasher: Hasher) -> dict[str, Any]:
    """``line`` with every IDENTIFIER_FIELDS value hashed, and those values replaced in its texts as well."""
    seen: dict[str, str] = {}
    hidden = _hash_fields(line, "", hasher, seen)
    if not seen:
        return dict(hidden)
    spelled = [re.escape(v) if len(v) >= SHORT else f"(?<=['\"]){re.escape(v)}(?=['\"])" for v in seen]
    pattern = re.compile("|".join(sorted(spelled, key=len, reverse=True)))
    return dict(_replace_in_texts(hidden, pattern, seen))


def _hash_fields(value: Any, name: str, hasher: Hasher, seen: dict[str, str]) -> Any:
    """``value`` (the field ``name``'s) with its identifiers hashed; each one's hash noted in ``seen``."""
    if isinstance(value, dict) and name in IDENTIFIER_FIELDS:  # a key as AttributeValues: one identifier
        value = json.dumps(value, sort_keys=True)
    if isinstance(value, dict):
        return {key: _hash_fields(item, key, hasher, seen) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_hash_fields(item, name, hasher, seen) for item in value]
    if name in IDENTIFIER_FIELDS and value is not None and not isinstance(value, bool) and str(value):
        seen[str(value)] = hasher(str(value))
        return seen[str(value)]
    return value


def _replace_in_texts(value: Any, pattern: re.Pattern[str], seen: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {key: _replace_in_texts(item, pattern, seen) for key, item in value.items()}
    if isinstance(value, list):
        return [_replace_in_texts(item, pattern, seen) for item in value]
    if isinstance(value, str) and value not in seen.values():
        return pattern.sub(lambda match: seen[match.group(0)], value)  # one pass: no hash is searched again
    return value
