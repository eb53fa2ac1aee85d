"""Reconcile's safe settings: the grace period has a floor (a session's grant exists before its item, so the grace
is what keeps the grant of a session being created), and a session table keyed another way than the convention is
either read with its own shape or refused before anything is listed."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from cleanup.application_contract import create_session, create_session_grant, live_session, touch_session
from schemas.settings import RECONCILE_GRACE_FLOOR_SECONDS, Settings
from tests.stack import SessionStack
from tests.test_reconcile import GRANTEE, HOUR, RETIRER, grant_dates  # noqa: F401 (a fixture)
from tests.test_template import parameter
from worker import cli


@pytest.fixture
def env(
    worker_env: SessionStack,
    grant_dates: dict[str, float],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> SessionStack:
    monkeypatch.setenv("SESSION_SORT_KEY", "meta")  # the table has a sort key: reconcile must be told the session's
    return worker_env


def grant(stack: SessionStack, session_id: str) -> str:
    return create_session_grant(
        stack.kms, stack.key_arn, session_id, grantee=GRANTEE, operations=["Decrypt"], retiring_principal=RETIRER
    )


def run(capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any] | None, list[str]]:
    """The exit code, the JSON summary (None when there is none), and the command's refusal lines."""
    code = cli.main(["reconcile", "--json"])
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    refusals = [line for line in captured.err.splitlines() if line.startswith("cleanup-worker reconcile:")]
    return code, json.loads(lines[-1]) if lines else None, refusals


def test_a_grace_below_the_floor_is_refused_and_the_grant_of_a_session_being_created_is_kept(
    env: SessionStack,
    grant_dates: dict[str, float],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    being_created = grant(env, "new-1")  # granted; its item is not written yet
    grant_dates[being_created] = time.time() - 5
    monkeypatch.setenv("RECONCILE_GRACE_SECONDS", "0")

    code, _, err = run(capsys)

    assert code == 2
    assert being_created in env.grant_ids()
    assert len(err) == 1 and "RECONCILE_GRACE_SECONDS" in err[0]


def test_the_floor_is_minutes_and_the_template_refuses_what_the_settings_refuse() -> None:
    assert RECONCILE_GRACE_FLOOR_SECONDS >= 600
    assert parameter("ReconcileGraceSeconds")["MinValue"] == RECONCILE_GRACE_FLOOR_SECONDS
    Settings(reconcile_grace_seconds=RECONCILE_GRACE_FLOOR_SECONDS)
    with pytest.raises(ValueError, match="RECONCILE_GRACE_SECONDS"):
        Settings(reconcile_grace_seconds=RECONCILE_GRACE_FLOOR_SECONDS - 1)


def test_a_session_written_with_the_deployments_sort_key_keeps_its_grant(
    env: SessionStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SESSION_SORT_KEY", "metadata")
    live = grant(env, "live-1")
    create_session(
        env.ddb, env.table, "live-1", tenant_id="t1", scratch_prefix="sessions/t1/live-1/", grant_id=live,
        ttl_seconds=HOUR, sort_key="metadata",
    )  # fmt: skip
    gone = grant(env, "gone-1")

    code, summary, _ = run(capsys)

    assert code == 0
    assert env.grant_ids() == {live}
    assert summary is not None and summary["grant"]["live"] == 1 and summary["grant"]["freed"] == 1
    assert gone not in env.grant_ids()


def test_the_write_path_reads_and_touches_the_item_under_its_sort_key(env: SessionStack) -> None:
    created = create_session(
        env.ddb, env.table, "s-1", tenant_id="t1", scratch_prefix="sessions/t1/s-1/", ttl_seconds=HOUR,
        sort_key="metadata",
    )  # fmt: skip

    assert created["sk"] == "metadata"
    assert live_session(env.ddb, env.table, "s-1", sort_key="metadata") is not None
    assert touch_session(env.ddb, env.table, "s-1", ttl_seconds=2 * HOUR, sort_key="metadata")
    assert live_session(env.ddb, env.table, "s-1") is None  # under the convention's "meta" there is nothing


@pytest.mark.parametrize(
    ("variable", "value"),
    [("ATTR_CONNECTION_ID", "pk"), ("ATTR_TENANT_ID", "pk"), ("ATTR_GRANT_ID", "sk"), ("ATTR_TTL", "sk")],
)
def test_a_key_that_holds_something_else_than_the_session_id_is_refused_and_nothing_is_freed(
    env: SessionStack, variable: str, value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The example of docs/configure.md: the partition key is the connection id, so no item lies under session#<id>.
    monkeypatch.setenv(variable, value)
    monkeypatch.setenv("SESSION_SORT_KEY", "metadata")
    live = grant(env, "live-1")
    env.put_item({"pk": "conn-abc", "sk": "metadata", "grantId": live, "ttl": int(time.time()) + HOUR})

    code, summary, err = run(capsys)

    assert code == 2 and summary is None
    assert live in env.grant_ids()
    assert len(err) == 1 and variable in err[0]


def test_a_sort_key_setting_on_a_table_without_a_sort_key_is_refused(
    env: SessionStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    table = f"{env.table}-pk-only"
    env.ddb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    monkeypatch.setenv("SESSION_TABLE", table)
    monkeypatch.setenv("SESSION_SORT_KEY", "metadata")
    live = grant(env, "live-1")

    code, _, err = run(capsys)

    assert code == 2
    assert live in env.grant_ids()
    assert len(err) == 1 and "SESSION_SORT_KEY" in err[0]


def test_a_session_written_with_the_deployments_key_prefix_keeps_its_grant(
    env: SessionStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SESSION_KEY_PREFIX", "SESSION#")
    live = grant(env, "live-1")
    create_session(
        env.ddb, env.table, "live-1", tenant_id="t1", scratch_prefix="sessions/t1/live-1/", grant_id=live,
        ttl_seconds=HOUR, key_prefix="SESSION#",
    )  # fmt: skip

    code, summary, _ = run(capsys)

    assert code == 0
    assert live in env.grant_ids()
    assert summary is not None and summary["grant"]["live"] == 1


def test_the_write_path_serves_a_table_without_a_sort_key(env: SessionStack) -> None:
    table = f"{env.table}-pk-only"
    env.ddb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )

    create_session(
        env.ddb, table, "s-1", tenant_id="t1", scratch_prefix="sessions/t1/s-1/", ttl_seconds=HOUR, sort_key=None
    )

    assert touch_session(env.ddb, table, "s-1", ttl_seconds=2 * HOUR, sort_key=None)
    assert live_session(env.ddb, table, "s-1", sort_key=None) is not None


def test_a_table_with_a_sort_key_and_no_sort_key_setting_is_refused_and_its_live_sessions_keep_their_grants(
    env: SessionStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The stream path takes any sort key; reconcile must not guess one: under 'meta', these sessions look gone.
    monkeypatch.delenv("SESSION_SORT_KEY")
    live = grant(env, "live-1")
    env.put_item({"pk": "session#live-1", "sk": "session", "grantId": live, "ttl": int(time.time()) + HOUR})

    code, summary, err = run(capsys)

    assert code == 2 and summary is None
    assert live in env.grant_ids()
    assert len(err) == 1 and "SESSION_SORT_KEY" in err[0]


def test_any_item_under_the_sessions_partition_key_keeps_its_grant(
    env: SessionStack, capsys: pytest.CaptureFixture[str]
) -> None:
    # SESSION_SORT_KEY=meta, but this deployment's sessions are written at another sort key: live all the same.
    live = grant(env, "live-1")
    env.put_item({"pk": "session#live-1", "sk": "session", "grantId": live, "ttl": int(time.time()) + HOUR})

    code, summary, _ = run(capsys)

    assert code == 0
    assert live in env.grant_ids()
    assert summary is not None and summary["grant"]["live"] == 1 and summary["grant"]["freed"] == 0


def test_a_pass_in_which_too_many_sessions_read_as_gone_frees_nothing_and_says_why(
    env: SessionStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = [grant(env, f"gone-{n}") for n in range(12)]  # twelve sessions whose items are not where they are read
    live = [grant(env, f"live-{n}") for n in range(3)]
    for n in range(3):
        env.put_item({"pk": f"session#live-{n}", "sk": "meta", "grantId": live[n], "ttl": int(time.time()) + HOUR})

    code, summary, _ = run(capsys)

    assert code == 1
    assert set(gone + live) <= env.grant_ids()  # nothing freed
    assert summary is not None and "RECONCILE_MAX_GONE_SHARE" in summary["stopped"]
    assert summary["grant"]["freed"] == 0 and summary["grant"]["failed"] == 12

    monkeypatch.setenv("RECONCILE_MAX_GONE_SHARE", "1")  # an operator who knows the pass cleans up after an outage
    code, summary, _ = run(capsys)

    assert code == 0 and env.grant_ids() == set(live)
