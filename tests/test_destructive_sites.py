"""Where the worker destroys: every call that frees a session's resource is made in one of a few known places, each
behind the fence's permit (``cleanup.core.fence``). A new call site fails here until it is added, with its reason."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from cleanup.actions import connection, grant, registry, scratch

ROOT = Path(__file__).resolve().parent.parent
FREES = {"delete_connection", "retire_grant", "revoke_grant", "delete_objects", "delete_object", "batch_write_item"}
"""boto3 methods that free a session's resource (a socket, a grant, scratch data, a room membership)."""

SITES = {
    # Each inside ``permit.sending(deadline)`` (its gate), in the same function: the permit is asked where the call
    # leaves (``cleanup.aws.permits``), and the send-time check refuses it without one.
    ("cleanup/actions/connection.py", "close_connection", "delete_connection"),
    ("cleanup/actions/grant.py", "retire_grant", "retire_grant"),
    ("cleanup/actions/registry.py", "_delete", "batch_write_item"),
    # A page's keys: alone (``_delete``), or through the batch's coalescer, whose DeleteObjects asks every page's gate
    # at once where it leaves (``delete_objects._send``).
    ("cleanup/actions/scratch.py", "_delete", "delete_object"),
    ("cleanup/actions/delete_objects.py", "_send", "delete_objects"),
    # Not a session's resource: a dead-letter record stored in S3, deleted once redriven.
    ("cleanup/queues/claim_check.py", "delete_stored", "delete_object"),
}


class _Sites(ast.NodeVisitor):
    """Each ``<client>.<method>`` of FREES, with the innermost function it is in (the actions module ``grant`` is
    not a client)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.functions: list[str] = []
        self.found: set[tuple[str, str, str]] = set()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()

    def visit_Attribute(self, node: ast.Attribute) -> None:
        owner = node.value.id if isinstance(node.value, ast.Name) else ""
        if node.attr in FREES and owner != "grant":
            self.found.add((self.path, self.functions[-1] if self.functions else "<module>", node.attr))
        self.generic_visit(node)


def destructive_calls() -> set[tuple[str, str, str]]:
    found: set[tuple[str, str, str]] = set()
    for path in [*ROOT.joinpath("cleanup").rglob("*.py"), *ROOT.joinpath("worker").rglob("*.py")]:
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith("worker/local/"):  # the demo's own stack: it creates and tears down, frees nothing
            continue
        sites = _Sites(relative)
        sites.visit(ast.parse(path.read_text()))
        found |= sites.found
    return found


def test_every_call_that_frees_a_resource_is_in_a_known_place() -> None:
    assert destructive_calls() == SITES


def test_every_action_that_frees_takes_a_required_permit() -> None:
    actions = (connection.close_connection, grant.retire_grant, registry.prune, registry.remove, scratch.delete_prefix)
    for action in actions:
        permit = inspect.signature(action).parameters["permit"]

        assert permit.kind is inspect.Parameter.KEYWORD_ONLY and permit.default is inspect.Parameter.empty


def test_reconcile_frees_through_the_action_api_not_the_built_in_actions() -> None:
    """Reconcile frees what it found as the pipeline does: through each kind's declared method and its gate, so that
    it names no built-in action's function (a kind is reached through ``ActionKind``, whichever module it is in)."""
    source = ROOT.joinpath("cleanup/operations/reconcile.py").read_text()
    named = {
        f"{node.value.id}.{node.attr}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
    }

    called = {"grant.retire_grant", "scratch.delete_prefix", "registry.remove", "registry.prune"} & named
    assert called == set()
