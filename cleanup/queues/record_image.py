"""What of a record's images the worker keeps in the messages it writes for itself: only what cleaning needs.

A dead-letter or backlog message (and its stored record) holds the record with its images cut to the key attributes
and the session attributes of ``AttributeNames`` (key, connection, callback URL, grant, key id, scratch prefix,
tenant, TTL, expiry bucket), and the enabled action kinds' own attributes. The rest of an ended session's item (what
the application kept there) is never copied
into a queue or an object: it is not needed to clean the session, and whoever may read the queue may not read it.
Any other shape (a record that could not be read) is kept as it came: it names nothing the worker can clean.
"""

from __future__ import annotations

from typing import Any

from schemas.settings import AttributeNames

IMAGES = ("OldImage", "NewImage")


def session_attributes(names: AttributeNames) -> frozenset[str]:
    """The item attributes a session's cleanup reads."""
    return frozenset(
        (
            names.pk,
            names.sk,
            names.connection_id,
            names.callback_url,
            names.grant_id,
            names.kms_key_id,
            names.scratch_prefix,
            names.tenant_id,
            names.ttl,
            names.expiry_bucket,
        )
    )


def needed_only(raw: Any, names: AttributeNames, own: tuple[str, ...] = ()) -> Any:
    """``raw`` with each image cut to its keys, session attributes and the enabled kinds' own attributes (``own``);
    any other shape as it is."""
    change = raw.get("dynamodb") if isinstance(raw, dict) else None
    if not isinstance(change, dict) or not any(isinstance(change.get(image), dict) for image in IMAGES):
        return raw
    keys = change.get("Keys")
    kept = session_attributes(names) | set(own) | (set(keys) if isinstance(keys, dict) else set())
    cut = dict(change)
    for image in IMAGES:
        if isinstance(change.get(image), dict):
            cut[image] = {name: value for name, value in change[image].items() if name in kept}
    return {**raw, "dynamodb": cut}
