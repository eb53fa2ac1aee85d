"""Which SESSION_BINDING fits a table, told from a sample of its sessions before anything is enforced.

One Scan page of the session table (``SCAN_LIMIT`` items, read-only) gives up to ``SAMPLE`` session items (by
SESSION_KEY_PREFIX and SESSION_SORT_KEY, as the worker tells them). Each one's grant is listed once (ListGrants by key
and grant id) and its scratch prefix resolved by the guard; each is then judged under every setting exactly as the
worker judges it (``cleanup.actions.binding``). The check fails when the setting in force would keep some of them, and
names the setting that frees them; it passes and says so when a stricter one would fit too. Resources the guard
refuses anyway (another bucket, a key not allowed) and grants already gone are left out: the binding does not decide
them.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from cleanup.actions.binding import check_bound, judge, worker_principal
from cleanup.actions.grant import listed
from cleanup.aws.calls import call_or_gone
from cleanup.aws.clients import Clients
from cleanup.core.classify import not_a_session_key
from cleanup.core.guard import grant_key, resolve_prefix, session_id
from cleanup.deadline import Deadline
from cleanup.exceptions import PermanentError, UnboundResourceError
from cleanup.operations.preflight import CheckResult, Target
from schemas.session import Session
from schemas.settings import Binding, Settings

SAMPLE = 20
SCAN_LIMIT = 200
SETTINGS = (Binding.STRICT, Binding.OWN, Binding.OFF)
NAME = "SESSION_BINDING fits a sample of the table's sessions"


@dataclass
class Tally:
    """What each setting would keep of the sampled sessions' grants and prefixes, and one reason of each."""

    sessions: int = 0
    judged: Counter[str] = field(default_factory=Counter)
    kept: dict[Binding, Counter[str]] = field(default_factory=lambda: {b: Counter() for b in SETTINGS})
    why: dict[Binding, str] = field(default_factory=dict)

    def keeps(self, binding: Binding) -> str:
        """``"3 of 5 grants, 1 of 5 prefixes"``: what ``binding`` would keep, or ``""`` when nothing."""
        kept = self.kept[binding]
        return ", ".join(f"{kept[what]} of {self.judged[what]} {what}s" for what in ("grant", "prefix") if kept[what])


def check_binding(clients: Clients, target: Target) -> CheckResult | None:
    """Whether SESSION_BINDING frees the grants and prefixes of a sample of the table's sessions (only said with the
    grant or scratch action)."""
    settings = target.settings
    if settings is None or not target.table or not {"grant", "scratch"} & target.actions:
        return None
    tally = sample(clients, target, settings)
    setting = settings.session_binding
    if tally is None:
        return None  # no table: its own check says so
    if not tally.sessions:
        return CheckResult(NAME, True, "no sessions to sample yet: run check again once the table holds some")
    seen = f"{tally.sessions} sessions sampled ({tally.judged['grant']} grants, {tally.judged['prefix']} prefixes)"
    keeps = tally.keeps(setting)
    if keeps:
        fits = next((b for b in SETTINGS if not tally.keeps(b)), Binding.OFF)
        detail = f"SESSION_BINDING={setting.value} would keep {keeps} of {seen}: {tally.why[setting]}"
        fix = f"set SESSION_BINDING={fits.value} (SessionBinding={fits.value})"
        if fits is Binding.OFF:
            fix += " if these are the sessions' own resources; else find who wrote these items"
        return CheckResult(NAME, False, detail, fix)
    stricter = [b for b in SETTINGS[: SETTINGS.index(setting)] if not tally.keeps(b)]
    hint = f"; {stricter[0].value} fits too, and holds every resource to its session's name" if stricter else ""
    return CheckResult(NAME, True, f"SESSION_BINDING={setting.value} frees all of {seen}{hint}")


def sample(clients: Clients, target: Target, settings: Settings) -> Tally | None:
    """Read up to ``SAMPLE`` sessions of the table and judge each one's grant and prefix under every setting (None
    when the table is not found)."""
    assert target.table is not None
    gone = ("ResourceNotFoundException",)
    page = call_or_gone(clients.dynamodb.scan, "Scan", None, gone, TableName=target.table, Limit=SCAN_LIMIT)
    if page is None:
        return None
    tally, deadline = Tally(), Deadline()
    known: list[str] = []

    def worker() -> str:
        if not known:
            known.append(target.worker_principal or worker_principal(clients)(deadline))
        return known[0]

    for item in page.get("Items", []):
        if tally.sessions >= SAMPLE or not_a_session_key(dict(item), settings) is not None:
            continue
        try:
            session = Session.decode(item, settings.attributes)
        except ValueError:
            continue  # an item the worker could not read either: no binding decides it
        tally.sessions += 1
        ident = session_id(session.pk, settings)
        if session.grant_id and "grant" in target.actions:
            _judge_grant(clients, settings, session, ident, worker, tally)
        if session.scratch_prefix is not None and "scratch" in target.actions:
            _judge_prefix(settings, session, ident, tally)
    return tally


def _judge_grant(
    clients: Clients, settings: Settings, session: Session, ident: str | None, worker: Any, tally: Tally
) -> None:
    assert session.grant_id is not None
    try:
        key = grant_key(session.kms_key_id, settings)
    except PermanentError:
        return  # refused whatever the binding
    grant = listed(clients.kms, key, session.grant_id, None)
    if grant is None:
        return  # already gone
    tally.judged["grant"] += 1
    for binding in SETTINGS:
        try:
            if binding is Binding.STRICT and ident is None:
                raise UnboundResourceError(f"the item's key {session.pk!r} names no session id")
            judge(grant, session.grant_id, ident, binding, worker)
        except UnboundResourceError as exc:
            tally.kept[binding]["grant"] += 1
            tally.why.setdefault(binding, _short(exc))


def _short(exc: UnboundResourceError) -> str:
    """What the binding found, without the advice that follows it in the worker's message."""
    return re.split(r": (?:it|set) ", str(exc), maxsplit=1)[0]


def _judge_prefix(settings: Settings, session: Session, ident: str | None, tally: Tally) -> None:
    assert session.scratch_prefix is not None
    try:
        where = resolve_prefix(session.scratch_prefix, settings, session.tenant_id)
    except PermanentError:
        return  # refused whatever the binding
    tally.judged["prefix"] += 1
    for binding in SETTINGS:
        try:
            check_bound(where, ident, binding, settings, session.tenant_id)
        except UnboundResourceError as exc:
            tally.kept[binding]["prefix"] += 1
            tally.why.setdefault(binding, _short(exc))
