"""``cleanup-worker check`` checks what the configured actions need, and only that, against moto over HTTP.

A socket-only deployment (ACTIONS=connection) has no scratch bucket, lifecycle rule or KMS key to check; a grant
without its key, or a bucket without its backstop, fails with one line. The binding check reads a sample of the
table's sessions and says which SESSION_BINDING frees their grants and prefixes, before anything is enforced.
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any

import pytest

from benchmarks.stack import EXAMPLES, Stack
from tests.stack import SessionStack, client, to_av
from worker import check
from worker.local.backend import create_session_table

CALLBACK = "https://abcdef1234.execute-api.us-east-1.amazonaws.com/prod"
ENV = ("SESSION_TABLE", "SCRATCH_BUCKET", "SCRATCH_ROOT", "KMS_KEY_ID", "WS_CALLBACK_URL", "ATTR_TTL", "ACTIONS")
ENV += ("BACKLOG_QUEUE_URL", "INTEGRITY_KEY_ID", "REGISTRY_TABLE", "SESSION_BINDING", "SESSION_KEY_PREFIX")
ENV += ("SESSION_SORT_KEY", "ATTR_CONNECTION_ID", "CONNECTION_ID_PATTERN", "DEAD_LETTER_QUEUE_URL")


@pytest.fixture(autouse=True)
def _no_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    parser = argparse.ArgumentParser()
    check.add_arguments(parser)
    code = check.main(parser.parse_args(list(argv)))
    return code, capsys.readouterr().out.splitlines()


def failures(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("FAIL")]


@pytest.fixture
def connections(aws: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A connection table (pk = conn#<id>, sk = metadata, TTL on expires_at), and the environment the socket-only
    example gives its function (deploy/examples/socket-only), pointed at it."""
    ddb = client("dynamodb")
    table = f"connections-{uuid.uuid4().hex[:8]}"
    create_session_table(ddb, table, ttl=False)
    ddb.update_time_to_live(TableName=table, TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires_at"})
    [example] = [path for path in EXAMPLES if path.parent.name == "socket-only"]
    for name, value in Stack.of(example).environment("CleanupFunction").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SESSION_TABLE", table)
    return table


def test_a_socket_only_configuration_passes_with_no_bucket_lifecycle_or_key(
    connections: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = run(capsys)

    assert (code, failures(lines)) == (0, [])
    names = [line.split(":", 1)[0].split(None, 1)[1] for line in lines]
    assert names == [
        "session table exists",
        "TTL enabled on 'expires_at'",
        "stream enabled with an old image",
        "callback endpoint set",
    ]


def test_a_socket_only_configuration_without_its_endpoint_fails_on_that_alone(
    connections: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WS_CALLBACK_URL")

    code, lines = run(capsys)

    assert code == 2
    assert [line.split(" --")[0] for line in failures(lines)] == ["FAIL callback endpoint set: no WS_CALLBACK_URL"]


@pytest.mark.parametrize(
    ("actions", "options", "failed"),
    [
        ("grant", (), ["KMS key exists and is enabled"]),
        ("scratch", ("--bucket", "{bucket}"), ["lifecycle backstop covers 'sessions/'"]),
        ("connection,grant", ("--callback-url", CALLBACK), ["KMS key exists and is enabled"]),
    ],
)
def test_each_action_fails_on_what_it_needs_and_nothing_else(
    stack: SessionStack,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    actions: str,
    options: tuple[str, ...],
    failed: list[str],
) -> None:
    monkeypatch.setenv("ACTIONS", actions)

    code, lines = run(capsys, "--table-name", stack.table, *(o.format(bucket=stack.bucket) for o in options))

    assert code == 2
    assert [line.split(":", 1)[0].removeprefix("FAIL ") for line in failures(lines)] == failed
    if "scratch" not in actions:
        assert not [line for line in lines if "bucket" in line or "lifecycle" in line]
    if "connection" not in actions:
        assert not [line for line in lines if "callback" in line]


def worker_arn() -> str:
    return str(client("sts").get_caller_identity()["Arn"]).replace(":sts::", ":iam::")


def seed_shape(stack: SessionStack, count: int, *, named: bool) -> None:
    """Sessions as a handler stores them: the grant's id in the item, a grant named for the session or not."""
    for n in range(count):
        sid = f"s-{n}"
        name = {"Name": f"session:{sid}"} if named else {}
        grant = stack.kms.create_grant(
            KeyId=stack.key_arn,
            GranteePrincipal="arn:aws:iam::123456789012:role/agent",
            Operations=["Decrypt"],
            RetiringPrincipal=worker_arn(),
            **name,
        )["GrantId"]
        item = {"pk": f"session#{sid}", "sk": "meta", "grantId": grant, "scratchPrefix": f"sessions/{sid}/"}
        stack.ddb.put_item(TableName=stack.table, Item=to_av({**item, "tenantId": "t1", "ttl": 1_700_000_000}))


def binding_line(lines: list[str]) -> str:
    [line] = [line for line in lines if "SESSION_BINDING" in line.split(":", 1)[0] or "binding" in line.split(":")[0]]
    return line


@pytest.mark.parametrize(("binding", "passed"), [("strict", False), ("own", True), ("off", True)])
def test_the_binding_check_says_which_setting_frees_a_sample_of_unnamed_grants(
    stack: SessionStack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, binding: str, passed: bool
) -> None:
    seed_shape(stack, 5, named=False)
    monkeypatch.setenv("ACTIONS", "grant")
    monkeypatch.setenv("SESSION_BINDING", binding)

    code, lines = run(capsys, "--table-name", stack.table, "--kms-key-id", stack.key_arn)

    line = binding_line(lines)
    assert line.startswith("ok" if passed else "FAIL"), line
    assert "5 sessions" in line
    if not passed:
        assert code == 2 and "SESSION_BINDING=strict would keep 5 of 5 grants" in line and "SESSION_BINDING=own" in line


def test_the_binding_check_says_strict_fits_sessions_named_as_the_write_path_names_them(
    stack: SessionStack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_shape(stack, 3, named=True)
    monkeypatch.setenv("ACTIONS", "grant,scratch")
    monkeypatch.setenv("SESSION_BINDING", "own")
    stack.s3.put_bucket_lifecycle_configuration(
        Bucket=stack.bucket,
        LifecycleConfiguration={
            "Rules": [
                {"ID": "c", "Status": "Enabled", "Filter": {"Prefix": "sessions/"}, "Expiration": {"Days": 7}},
                {
                    "ID": "v",
                    "Status": "Enabled",
                    "Filter": {"Prefix": "sessions/"},
                    "NoncurrentVersionExpiration": {"NoncurrentDays": 7},
                },
            ]
        },
    )

    code, lines = run(capsys, "--table-name", stack.table, "--kms-key-id", stack.key_arn, "--bucket", stack.bucket)

    assert (code, failures(lines)) == (0, [])
    assert "strict fits too" in binding_line(lines)


def test_the_binding_check_reports_an_empty_table_as_nothing_to_sample(
    stack: SessionStack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACTIONS", "grant")

    code, lines = run(capsys, "--table-name", stack.table, "--kms-key-id", stack.key_arn)

    assert code == 0 and "no sessions to sample" in binding_line(lines)
