"""``cleanup-worker reconcile`` against moto over HTTP: sessions deleted behind the stream's back (their records never
delivered) leave grants and scratch prefixes; reconcile frees exactly those, and touches no live session's resource
and nothing that follows no convention."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import botocore.session
import pytest

from cleanup.application_contract import create_session, create_session_grant
from cleanup.aws import clients
from tests.stack import SessionStack
from worker import cli
from worker.local.appconfig import LocalAgent, flag
from worker.local.backend import DEFAULT_ACCOUNT_ID

HOUR = 3600
GRANTEE = "arn:aws:iam::123456789012:role/agent"
RETIRER = "arn:aws:iam::123456789012:role/cleanup"


@pytest.fixture
def grant_dates(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """moto's ListGrants gives no CreationDate (KMS does): each grant gets one, two hours ago unless set here."""
    from moto.kms.models import Grant

    dates: dict[str, float] = {}
    listed = Grant.to_json

    def to_json(grant: Grant) -> dict[str, Any]:
        return {**listed(grant), "CreationDate": dates.get(grant.id, time.time() - 2 * HOUR)}

    monkeypatch.setattr(Grant, "to_json", to_json)
    return dates


@pytest.fixture
def env(worker_env: SessionStack, grant_dates: dict[str, float], monkeypatch: pytest.MonkeyPatch) -> SessionStack:
    monkeypatch.setenv("SCRATCH_TENANT_SCOPED", "true")  # the stack's layout: sessions/<tenant>/<session>/
    monkeypatch.setenv("SESSION_SORT_KEY", "meta")  # the table has a sort key: reconcile must be told the session's
    return worker_env


def session(stack: SessionStack, session_id: str, *, ttl_seconds: int = HOUR, objects: int = 2) -> str:
    """A session as the write path makes it: a grant named by the convention, scratch data, the item. Returns the
    grant's id."""
    grant_id = create_session_grant(
        stack.kms, stack.key_arn, session_id, grantee=GRANTEE, operations=["Decrypt"], retiring_principal=RETIRER
    )
    prefix = f"sessions/t1/{session_id}/"
    for n in range(objects):
        stack.s3.put_object(Bucket=stack.bucket, Key=f"{prefix}part-{n}", Body=b"scratch")
    create_session(
        stack.ddb,
        stack.table,
        session_id,
        tenant_id="t1",
        scratch_prefix=prefix,
        grant_id=grant_id,
        ttl_seconds=ttl_seconds,
    )
    return grant_id


def age(stack: SessionStack, prefix: str, seconds: float = 2 * HOUR) -> None:
    """Make the objects under ``prefix`` ``seconds`` old (in moto's in-process S3)."""
    from moto.core.utils import utcnow
    from moto.s3.models import s3_backends

    bucket = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].buckets[stack.bucket]
    for name, versions in bucket.keys.iterlists():
        if name.startswith(prefix):
            for version in versions:
                version.last_modified = utcnow() - timedelta(seconds=seconds)


def run(capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = cli.main(["reconcile", "--json"])
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_reconcile_retires_the_grants_of_gone_sessions_and_no_other(
    env: SessionStack, grant_dates: dict[str, float], capsys: pytest.CaptureFixture[str]
) -> None:
    leaked = [session(env, "gone-1"), session(env, "gone-2"), session(env, "expired-1", ttl_seconds=-2 * HOUR)]
    env.delete("gone-1")
    env.delete("gone-2")  # deleted behind the stream's back: their records never reach the worker
    live = session(env, "live-1")
    late = session(env, "expired-just-now", ttl_seconds=-60)  # past its ttl by less than the grace period
    young = create_session_grant(
        env.kms, env.key_arn, "orphan-young", grantee=GRANTEE, operations=["Decrypt"], retiring_principal=RETIRER
    )
    grant_dates[young] = time.time() - 60
    foreign = [
        env.kms.create_grant(KeyId=env.key_arn, GranteePrincipal=GRANTEE, Operations=["Decrypt"])["GrantId"],
        env.kms.create_grant(KeyId=env.key_arn, GranteePrincipal=GRANTEE, Operations=["Decrypt"], Name="app-x")[
            "GrantId"
        ],
    ]

    code, summary = run(capsys)

    assert code == 0
    assert env.grant_ids() == {live, late, young, *foreign}
    assert set(leaked).isdisjoint(env.grant_ids())
    assert summary["grant"] == {
        "listed": 8,
        "freed": 3,
        "gone": 0,
        "planned": 0,
        "live": 2,
        "young": 1,
        "unconventional": 2,
        "failed": 0,
    }


def test_without_reconcile_scratch_no_prefix_is_listed_or_deleted(
    env: SessionStack, capsys: pytest.CaptureFixture[str]
) -> None:
    session(env, "gone-1")
    env.delete("gone-1")
    age(env, "sessions/t1/gone-1/")

    code, summary = run(capsys)

    assert code == 0
    assert len(env.objects("sessions/t1/gone-1/")) == 2
    assert summary["scratch"]["listed"] == 0


def test_reconcile_deletes_the_scratch_prefixes_of_gone_sessions_and_no_other(
    env: SessionStack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECONCILE_SCRATCH", "true")
    for session_id in ("gone-1", "gone-2", "expired-1", "live-1", "young-gone"):
        session(env, session_id, ttl_seconds=-2 * HOUR if session_id == "expired-1" else HOUR)
    for session_id in ("gone-1", "gone-2", "young-gone"):
        env.delete(session_id)
    env.put_objects(["sessions/t1/not.a.session/data", "sessions/t1/loose-object", "elsewhere/gone-9/data"])
    for prefix in ("sessions/t1/gone-", "sessions/t1/expired-1/", "sessions/t1/live-1/", "sessions/t1/not.a", "else"):
        age(env, prefix)

    code, summary = run(capsys)

    assert code == 0
    assert env.objects("sessions/t1/gone-") == [] and env.objects("sessions/t1/expired-1/") == []
    assert len(env.objects("sessions/t1/live-1/")) == 2
    assert len(env.objects("sessions/t1/young-gone/")) == 2  # newer than the grace period
    assert env.objects("sessions/t1/not.a.session/") and env.objects("sessions/t1/loose-object")
    assert env.objects("elsewhere/")
    assert summary["scratch"] == {
        "listed": 6,
        "freed": 3,
        "gone": 0,
        "planned": 0,
        "live": 1,
        "young": 1,
        "unconventional": 1,
        "failed": 0,
    }


def test_a_dry_run_frees_nothing_and_prints_the_plan(
    env: SessionStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CLEANUP_MODE", "dry-run")
    monkeypatch.setenv("RECONCILE_SCRATCH", "true")
    grant_id = session(env, "gone-1")
    env.delete("gone-1")
    age(env, "sessions/t1/gone-1/")

    code = cli.main(["reconcile"])

    out = capsys.readouterr().out
    assert code == 0
    assert grant_id in env.grant_ids() and len(env.objects("sessions/t1/gone-1/")) == 2
    assert f"would free grant {grant_id}" in out and "would free scratch sessions/t1/gone-1/" in out


def test_a_session_recreated_after_the_decision_keeps_its_grant(
    env: SessionStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    grant_id = session(env, "back-1", objects=0)
    env.delete("back-1")
    reads: list[str] = []

    def recreate(**_: Any) -> None:
        reads.append("Query")
        if len(reads) == 1:  # the decision's read saw no session; it comes back before the fence's read
            env.put_item({"pk": "session#back-1", "sk": "meta", "tenantId": "t1", "ttl": int(time.time()) + HOUR})

    hooked = botocore.session.get_session()
    hooked.register("after-call.dynamodb.Query", recreate)
    monkeypatch.setattr(clients, "_session", hooked)

    code, summary = run(capsys)

    assert code == 0
    assert grant_id in env.grant_ids()
    assert summary["grant"]["live"] == 1 and summary["grant"]["freed"] == 0
    assert len(reads) == 2


def test_paused_by_the_kill_switch_it_frees_nothing(
    env: SessionStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    grant_id = session(env, "gone-1")
    env.delete("gone-1")
    age(env, "sessions/t1/gone-1/")
    with LocalAgent() as agent:
        for name, value in zip(("APPLICATION", "ENVIRONMENT", "PROFILE"), agent.names, strict=True):
            monkeypatch.setenv(f"APPCONFIG_{name}", value)
        monkeypatch.setenv("APPCONFIG_AGENT_URL", agent.url)
        agent.serve(flag(False))

        code = cli.main(["reconcile"])

    assert code == 1
    assert "paused" in capsys.readouterr().out
    assert grant_id in env.grant_ids() and len(env.objects("sessions/t1/gone-1/")) == 2


def test_without_a_session_table_it_is_a_usage_error(
    env: SessionStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SESSION_TABLE")

    assert cli.main(["reconcile"]) == 2
    assert "SESSION_TABLE" in capsys.readouterr().err


def test_the_scheduled_handler_frees_what_the_command_would(env: SessionStack) -> None:
    from worker import reconcile as entry

    grant_id = session(env, "gone-1", objects=0)
    env.delete("gone-1")

    with entry.warm.use(env.runtime(scratch_tenant_scoped=True)):
        summary = entry.handler({}, None)

    assert grant_id not in env.grant_ids()
    assert summary["grant"]["freed"] == 1


def test_a_session_id_outside_the_convention_gets_no_grant(env: SessionStack) -> None:
    with pytest.raises(ValueError, match="session id"):
        create_session_grant(
            env.kms, env.key_arn, "a#b", grantee=GRANTEE, operations=["Decrypt"], retiring_principal=RETIRER
        )
