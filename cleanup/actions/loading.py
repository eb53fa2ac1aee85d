"""Which action kinds a process runs: ACTIONS, in its order, checked at start.

The four built-ins are imported here; any other kind is found through the entry-point group ``session_cleanup.actions``
(``name = "package.module:Class"``), or registered in code with ``register`` (under the same checks). Only the names
ACTIONS enables are imported, and the group is scanned only when it names a kind that is not built in. A kind is
refused, with one line naming it, when:

* its name is unknown, or given twice in ACTIONS, or two entry points give it different targets;
* it is not an ``ActionKind`` of this API version, or its ``name`` is not the name it is enabled by;
* it declares a field that ``AttributeNames`` does not have, or a field another enabled kind owns;
* it declares an attribute of its own or a freeing operation (``service.Operation``) that is not well formed;
* it declares no ``paced_by``.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Sequence
from functools import cache
from importlib.metadata import entry_points

from cleanup.actions.connection import Connection
from cleanup.actions.grant import Grant
from cleanup.actions.http_close import HttpClose
from cleanup.actions.registry import Membership
from cleanup.actions.scratch import Scratch
from cleanup.core.action_api import API_VERSION, ActionKind
from cleanup.exceptions import ConfigurationError
from schemas.settings import AttributeNames, Settings

GROUP = "session_cleanup.actions"
DEFAULT = "connection,grant,scratch,registry"
BUILT_IN: dict[str, type[ActionKind]] = {
    kind.name: kind for kind in (Connection, Grant, Scratch, Membership, HttpClose)
}
"""The kinds the worker ships: DEFAULT's, and ``http-close`` (in place of ``connection``)."""
REPLACED_BY = {"connection": "http-close"}
"""A kind and the one documented in its place (docs/actions.md): a message naming the first, read by a worker that
runs the second instead, is cleaned by the second."""

_registered: dict[str, type[ActionKind]] = {}
_ATTRIBUTE = re.compile(r"[A-Za-z0-9_.#:-]{1,255}")
_OPERATION = re.compile(r"[a-z0-9-]+\.[A-Z][A-Za-z0-9]+")


def register(kind: type[ActionKind]) -> type[ActionKind]:
    """Make ``kind`` loadable by its name, as an entry point would (a decorator). A name already taken by another
    kind is refused.

    Raises:
        ConfigurationError: the name is a built-in's, or another registered kind's.
    """
    taken = _registered.get(kind.name)
    if kind.name in BUILT_IN or (taken is not None and taken is not kind):
        raise _refused(f"action {kind.name!r} is already registered")
    _registered[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    """Forget a kind registered in code (for tests)."""
    _registered.pop(name, None)
    load_kinds.cache_clear()


@cache
def load_kinds(enabled: str) -> tuple[type[ActionKind], ...]:
    """The kinds ACTIONS (``enabled``: comma-separated names) enables, in its order, checked.

    Raises:
        ConfigurationError: one line naming the kind refused and why.
    """
    names = [name.strip() for name in enabled.split(",") if name.strip()]
    if not names:
        raise _refused("no action enabled")
    kinds: list[type[ActionKind]] = []
    owners: dict[str, str] = {}
    for name in names:
        if any(kind.name == name for kind in kinds):
            raise _refused(f"action {name!r} is named twice")
        kind = _load(name)
        _check(name, kind, owners)
        kinds.append(kind)
    return tuple(kinds)


def instances(kinds: Sequence[type[ActionKind]], settings: Settings) -> tuple[ActionKind, ...]:
    """One of each kind, for ``settings``; two owned fields (or a kind's own attributes) that name one item
    attribute are refused.

    Raises:
        ConfigurationError: a kind's owned field is spelt, through ``ATTR_*``, as another kind's.
    """
    spelt: dict[str, str] = {}
    for kind in kinds:
        for attribute in (*(getattr(settings.attributes, owned) for owned in kind.owns), *kind.attributes):
            if spelt.setdefault(attribute, kind.name) != kind.name:
                why = f"owns attribute {attribute!r}, already {spelt[attribute]!r}'s (ATTR_*)"
                raise _refused(f"action {kind.name!r}: {why}")
    return tuple(kind(settings) for kind in kinds)


def _load(name: str) -> type[ActionKind]:
    if name in BUILT_IN:
        return BUILT_IN[name]
    if name in _registered:
        return _registered[name]
    targets = _entry_points().get(name, set())
    if not targets:
        raise _refused(f"unknown action {name!r} (installed: {', '.join(sorted(installed()))})")
    if len(targets) > 1:
        raise _refused(f"action {name!r}: entry points name different targets: {', '.join(sorted(targets))}")
    return _target(name, next(iter(targets)))


def installed() -> set[str]:
    """Every action's name this process could enable."""
    return set(BUILT_IN) | set(_registered) | set(_entry_points())


@cache
def _entry_points() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for point in entry_points(group=GROUP):  # the same plugin installed twice is one target, not a collision
        found.setdefault(point.name, set()).add(point.value)
    return found


def _target(name: str, target: str) -> type[ActionKind]:
    module, _, attribute = target.partition(":")
    try:
        loaded: object = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise _refused(f"action {name!r}: cannot load {target!r}: {exc}") from exc
    if not (isinstance(loaded, type) and issubclass(loaded, ActionKind)):
        raise _refused(f"action {name!r}: {target!r} is not an ActionKind")
    return loaded


def _check(name: str, kind: type[ActionKind], owners: dict[str, str]) -> None:
    if getattr(kind, "name", None) != name:
        raise _refused(f"action {name!r}: its kind is named {getattr(kind, 'name', None)!r}")
    if kind.api_version != API_VERSION:
        why = f"action API version {kind.api_version}, this worker runs {API_VERSION}"
        if kind.api_version == 1:
            why += " (version 2: a kind frees only through its gates, Gate.aws, and is given read-only clients)"
        raise _refused(f"action {name!r}: {why}")
    if not isinstance(getattr(kind, "paced_by", None), str) or not kind.paced_by:
        raise _refused(f"action {name!r}: declares no paced_by service")
    unknown = [field for field in (*kind.owns, *kind.reads, *kind.naming()) if field not in AttributeNames.model_fields]
    if unknown:
        raise _refused(f"action {name!r}: reads {', '.join(unknown)}, not attributes ATTR_* names")
    bad = [text for text in kind.attributes if not _ATTRIBUTE.fullmatch(str(text))]
    bad += [text for text in kind.frees if not _OPERATION.fullmatch(str(text))]
    if bad:
        raise _refused(f"action {name!r}: {', '.join(map(repr, bad))}: not an attribute name or service.Operation")
    for owned in kind.owns:
        if owners.setdefault(owned, name) != name:
            raise _refused(f"action {name!r}: owns {owned!r}, already owned by {owners[owned]!r}")


def _refused(why: str) -> ConfigurationError:
    return ConfigurationError({"ACTIONS": why})
