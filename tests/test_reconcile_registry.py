"""``cleanup-worker reconcile`` on the connection registry, against moto over HTTP: sessions deleted behind the
stream's back (their records never delivered) leave room memberships; reconcile removes exactly those, and touches
no live or just-expired session's membership, no young one, and none that names no session."""

from __future__ import annotations

import json
import time
from typing import Any

import botocore.session
import pytest

from cleanup.application_contract import DEFAULT_NAMES, create_session, join_room
from cleanup.aws import clients
from cleanup.operations import leaks
from schemas.convention import membership_item
from tests.stack import SessionStack
from worker import cli
from worker.local.backend import create_registry_table

HOUR = 3600
ROOMS = 3
LONG_AGO = time.time() - 4 * HOUR  # past the grace and API Gateway's two-hour cap on a connection


@pytest.fixture
def env(worker_env: SessionStack, monkeypatch: pytest.MonkeyPatch) -> SessionStack:
    """The worker's environment with a connection registry."""
    create_registry_table(worker_env.ddb, registry_table(worker_env))
    monkeypatch.setenv("REGISTRY_TABLE", registry_table(worker_env))
    monkeypatch.setenv("SESSION_SORT_KEY", "meta")
    return worker_env


def registry_table(stack: SessionStack) -> str:
    return f"registry-{stack.table}"


def session(stack: SessionStack, session_id: str, *, ttl_seconds: int = HOUR, joined: float = LONG_AGO) -> str:
    """A session on its own connection, member of ROOMS rooms (in several shards) since ``joined``; returns the
    connection id."""
    connection_id = f"conn-{session_id}"
    create_session(
        stack.ddb,
        stack.table,
        session_id,
        tenant_id="t1",
        scratch_prefix=f"sessions/t1/{session_id}/",
        connection_id=connection_id,
        ttl_seconds=ttl_seconds,
    )
    for room in range(ROOMS):
        join_room(stack.ddb, registry_table(stack), f"r{room}", connection_id, session_id, shard=room, now=joined)
    return connection_id


def put_membership(stack: SessionStack, item: dict[str, Any]) -> None:
    stack.ddb.put_item(TableName=registry_table(stack), Item=item)


def old_membership(room: str, connection_id: str, session_id: str | None) -> dict[str, Any]:
    return membership_item(
        room, connection_id, session_id, shard=0, joined_at=int(LONG_AGO), ttl_seconds=HOUR, names=DEFAULT_NAMES
    )


def members(stack: SessionStack) -> dict[str, int]:
    """How many memberships each connection has, as the table holds them."""
    found: dict[str, int] = {}
    for page in stack.ddb.get_paginator("scan").paginate(TableName=registry_table(stack), ConsistentRead=True):
        for item in page["Items"]:
            found[item["connectionId"]["S"]] = found.get(item["connectionId"]["S"], 0) + 1
    return found


def run(capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = cli.main(["reconcile", "--json"])
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_reconcile_removes_the_memberships_of_gone_sessions_and_no_other(
    env: SessionStack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(leaks, "SCAN_PAGE", 4)  # several Scan pages, a connection's memberships spread over them
    gone = [session(env, "gone-1"), session(env, "gone-2"), session(env, "expired-1", ttl_seconds=-2 * HOUR)]
    young = session(env, "young-gone", joined=time.time() - 60)
    env.delete("gone-1")
    env.delete("gone-2")  # deleted behind the stream's back: their records never reach the worker
    live = session(env, "live-1")
    late = session(env, "expired-just-now", ttl_seconds=-60)  # past its ttl by less than the grace period
    env.delete("young-gone")
    undated = old_membership("r0", "conn-no-date", "no-date")
    del undated["joinedAt"]  # its age is unknown: kept, as a grant without a CreationDate
    put_membership(env, undated)
    put_membership(env, old_membership("r0", "conn-anonymous", None))  # names no session
    misnamed = {**old_membership("r1", "conn-gone-1", "gone-1"), "sk": {"S": "user#u1"}}  # its key is not the conn's
    put_membership(env, misnamed)

    code, summary = run(capsys)

    assert code == 0
    assert members(env) == {
        live: ROOMS,
        late: ROOMS,
        young: ROOMS,
        "conn-no-date": 1,
        "conn-anonymous": 1,
        gone[0]: 1,  # the row whose key does not name its connection
    }
    assert summary["registry"] == {
        "listed": 6 * ROOMS + 3,
        "freed": 3 * ROOMS,
        "gone": 0,
        "planned": 0,
        "live": 2 * ROOMS,
        "young": ROOMS + 1,
        "unconventional": 2,
        "failed": 0,
    }


def test_a_dry_run_removes_no_membership_and_prints_the_plan(
    env: SessionStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CLEANUP_MODE", "dry-run")
    connection_id = session(env, "gone-1")
    env.delete("gone-1")

    code = cli.main(["reconcile"])

    out = capsys.readouterr().out
    assert code == 0
    assert members(env) == {connection_id: ROOMS}
    assert f"would free registry {connection_id} (room#r0#0/conn#{connection_id}) of session gone-1" in out


def test_a_session_recreated_after_the_decision_keeps_its_memberships(
    env: SessionStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    connection_id = session(env, "back-1")
    env.delete("back-1")
    reads: list[str] = []

    def recreate(**_: Any) -> None:
        reads.append("Query")
        if len(reads) == 1:  # the decision's read saw no session; it comes back, on the same connection, before
            # the fence's read
            item = {"pk": "session#back-1", "sk": "meta", "tenantId": "t1", "connectionId": connection_id}
            env.put_item({**item, "ttl": int(time.time()) + HOUR})

    hooked = botocore.session.get_session()
    hooked.register("after-call.dynamodb.Query", recreate)
    monkeypatch.setattr(clients, "_session", hooked)

    code, summary = run(capsys)

    assert code == 0
    assert members(env) == {connection_id: ROOMS}
    assert summary["registry"]["live"] == ROOMS and summary["registry"]["freed"] == 0
    assert len(reads) == 2


def test_a_registry_that_cannot_be_scanned_stops_the_scan_and_fails_the_run(
    env: SessionStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REGISTRY_TABLE", "no-such-registry")

    code, summary = run(capsys)

    assert code == 1
    assert "no-such-registry" in summary["stopped"]
    assert summary["registry"]["listed"] == 0


def test_a_membership_of_a_session_id_outside_the_convention_is_not_written(env: SessionStack) -> None:
    with pytest.raises(ValueError, match="session id"):
        join_room(env.ddb, registry_table(env), "r0", "conn-1", "a#b")

    assert members(env) == {}


def test_a_membership_younger_than_a_connection_can_live_is_kept(
    env: SessionStack, capsys: pytest.CaptureFixture[str]
) -> None:
    # Past the grace period, but not past API Gateway's two-hour cap and the grace: its connection may still be open.
    session(env, "gone-recent", joined=time.time() - 2 * HOUR)
    env.delete("gone-recent")

    code, summary = run(capsys)

    assert code == 0
    assert summary["registry"]["young"] == ROOMS and summary["registry"]["freed"] == 0
