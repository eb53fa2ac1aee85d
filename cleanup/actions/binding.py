"""SESSION_BINDING's rules: whether a grant or a scratch prefix an item names is its session's.

Whoever can write the session table (or invoke the functions directly) can write an item naming another session's
grant or prefix and delete it. The item's key names its session's id (``cleanup.core.guard.session_id``); the
resources it names are held to it:

* ``strict``: a grant named ``session:<id>`` and a prefix ending in ``<id>/`` only, as the write path writes them;
* ``own`` (the default): that, or a grant with no name whose retiring principal is this worker (a grant made for the
  worker to retire); a grant named for another session, named otherwise, or made for another principal is kept. A
  prefix is held to the id where the key names one;
* ``off``: whatever the item names (the guard's root, tenant and key rules still hold).

``judge`` rules on a grant as ListGrants lists it (``cleanup.actions.grant`` reads it; ``cleanup-worker check`` samples
a table's); ``check_bound`` on a prefix. This worker's own principal is asked of STS once per process
(``worker_principal``; GetCallerIdentity needs no permission).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from cleanup.aws.calls import call
from cleanup.aws.clients import Clients
from cleanup.deadline import Deadline
from cleanup.exceptions import TransientError, UnboundResourceError
from schemas.convention import GRANT_NAME_PREFIX, grant_name
from schemas.settings import Binding, Settings

if TYPE_CHECKING:
    from mypy_boto3_kms.type_defs import GrantListEntryTypeDef

    from cleanup.core.guard import ScratchLocation

ASKING_WAIT_SECONDS = 30.0  # the longest a thread waits for another's GetCallerIdentity, where no deadline is sooner
_principals: WeakKeyDictionary[Clients, str] = WeakKeyDictionary()
_asking = threading.Lock()


def judge(
    grant: GrantListEntryTypeDef,
    grant_id: str,
    session_id: str | None,
    binding: Binding,
    worker: Callable[[], str],
) -> None:
    """That a listed grant is bound to ``session_id`` under ``binding`` (``worker``: this worker's own principal,
    asked only for an unnamed grant under ``own``).

    Raises:
        UnboundResourceError: it is not (see the module's docstring); the message says what to do.
    """
    name = grant.get("Name", "")
    if binding is Binding.OFF or (session_id is not None and name == grant_name(session_id)):
        return
    expected = grant_name(session_id) if session_id is not None else "session:<id>"
    if binding is Binding.STRICT:
        raise UnboundResourceError(
            f"grant {grant_id!r} is named {name!r}, not {expected!r}: it is not bound to this session and is kept. "
            "If the table's grants are not named for their session, set SESSION_BINDING=own (which frees an unnamed "
            "grant made for this worker) or off; else find who wrote this item"
        )
    if name:
        whose = "another session's name" if name.startswith(GRANT_NAME_PREFIX) else "a name that is no session's"
        raise UnboundResourceError(
            f"grant {grant_id!r} is named {name!r}, {whose}, not {expected!r}: it is kept. A forged or misplaced "
            "name: find who wrote this item; if the table's grants carry names of their own, set SESSION_BINDING=off"
        )
    retiring, me = grant.get("RetiringPrincipal"), worker()
    if not same_principal(retiring, me):
        raise UnboundResourceError(
            f"grant {grant_id!r} is unnamed and its retiring principal is {retiring!r}, not this worker ({me!r}): it "
            "was not made for this worker to retire and is kept. Create the sessions' grants with RetiringPrincipal "
            "the worker's role (the stack's CleanupRoleArn), or set SESSION_BINDING=off"
        )


def check_bound(
    where: ScratchLocation,
    session_id: str | None,
    binding: Binding = Binding.STRICT,
    settings: Settings | None = None,
    tenant_id: str | None = None,
) -> None:
    """That ``where`` is bound to the session ``session_id`` under ``binding``: it is exactly ``<root><id>/`` or, for a
    session with a tenant, ``<root><tenant>/<id>/`` (as the write path writes it), ``<root>`` being SCRATCH_ROOT (and
    the tenant's folder with SCRATCH_TENANT_SCOPED; without ``settings``, its last segment is the id). A prefix that
    only ends in the id (``<root><tenant>/<another id>/<id>/``) is another session's folder, or lies in one. With
    ``own``, a key that names no session id (a binary key, a key outside the convention) holds its prefix to nothing
    but the guard's root and tenant.

    Raises:
        UnboundResourceError: it is not, or (``strict``) the item's key names no session id (None): nothing is deleted.
    """
    if binding is Binding.OFF or (session_id is None and binding is Binding.OWN):
        return
    if session_id is None:
        raise UnboundResourceError(
            f"the item's key names no session id, so scratch prefix {where.prefix!r} cannot be bound to it and is "
            "kept: set SESSION_KEY_PREFIX to the key's prefix, or SESSION_BINDING=own (or off) if the table follows "
            "no such convention"
        )
    bound = _folders(session_id, settings, tenant_id)
    if (where.prefix not in bound) if bound else where.prefix[:-1].rpartition("/")[2] != session_id:
        shown = " or ".join(sorted(map(repr, bound))) if bound else f"a folder named {session_id!r}"
        raise UnboundResourceError(
            f"scratch prefix {where.prefix!r} is not {shown}: it is not bound to this session and is kept. If the "
            "table's prefixes are not laid out so, set SESSION_BINDING=off; else find who wrote this item"
        )


def _folders(session_id: str, settings: Settings | None, tenant_id: str | None) -> set[str]:
    """The prefixes that are the session's own folder (none to compare with, without ``settings``)."""
    if settings is None:
        return set()
    root = settings.scratch_root
    if settings.scratch_tenant_scoped:
        return {f"{root}{tenant_id}/{session_id}/"}
    return {f"{root}{session_id}/", *((f"{root}{tenant_id}/{session_id}/",) if tenant_id else ())}


def same_principal(named: str | None, worker: str) -> bool:
    """Whether the principal ``named`` (a grant's RetiringPrincipal) is ``worker`` (the caller's identity, an
    assumed-role session or a user). A role is compared by partition, account and name, its path aside: an
    assumed-role session names the role without its path, and a role's name is unique in its account."""
    return named is not None and _principal(named) == _principal(worker)


def _principal(arn: str) -> tuple[str, ...]:
    parts = arn.split(":", 5)
    if len(parts) != 6 or parts[0] != "arn" or parts[2] not in ("iam", "sts"):
        return ("text", arn)
    kind, _, rest = parts[5].partition("/")
    if kind == "assumed-role":
        kind, rest = "role", rest.partition("/")[0]
    elif kind in ("role", "user"):
        rest = rest.rpartition("/")[2]
    else:
        return ("text", arn)
    return (parts[1], parts[4], kind, rest)


def worker_principal(clients: Clients) -> Callable[[Deadline], str]:
    """This worker's own principal (its role's assumed-role session, or a user), asked of STS once per ``clients``."""

    def ask(deadline: Deadline) -> str:
        if not _asking.acquire(timeout=max(0.0, min(deadline.remaining(), ASKING_WAIT_SECONDS))):
            raise TransientError("GetCallerIdentity: another thread's question did not end in time")
        try:
            known = _principals.get(clients)
            if known is None:
                sts = clients.get("sts")
                answer = call(sts.get_caller_identity, "GetCallerIdentity", deadline)
                if not isinstance(answer.get("Arn"), str):
                    raise TransientError("GetCallerIdentity: an answer without an Arn: cannot tell who this worker is")
                known = _principals[clients] = str(answer["Arn"])
            return known
        finally:
            _asking.release()

    return ask
