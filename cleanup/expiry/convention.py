"""How a session's item key, grant name and scratch prefix are spelled, so that reconcile can map a resource back to
its session (the write path writes them so; an application creating its own follows the same convention).

* session id: 1 to 128 letters, digits, ``_`` or ``-`` (``SESSION_ID``);
* item key: ``pk = session#<id>`` (or SESSION_KEY_PREFIX + id) and, in a table with a sort key, ``sk = meta`` (or
  SESSION_SORT_KEY);
* KMS grant Name: ``session:<id>`` (KMS grant names take letters, digits and ``:/_-`` only, so not the ``#`` key);
* scratch prefix: ``<root><id>/``, or ``<root><tenant>/<id>/`` when SCRATCH_TENANT_SCOPED is on.
"""

from __future__ import annotations

import re

KEY_PREFIX = "session#"
SORT_KEY = "meta"
GRANT_NAME_PREFIX = "session:"
SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def grant_name(session_id: str) -> str:
    """The Name of ``session_id``'s grant: ``session:<session-id>``.

    Raises:
        ValueError: the id does not follow the convention (``SESSION_ID``).
    """
    if not SESSION_ID.fullmatch(session_id):
        raise ValueError(f"session id {session_id!r} is not 1-128 letters, digits, '_' or '-': no grant name for it")
    return f"{GRANT_NAME_PREFIX}{session_id}"
