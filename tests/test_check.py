"""``cleanup-worker check`` against moto over HTTP: a correct stack passes, each misconfiguration fails with its fix."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from tests.stack import SessionStack, client, table_exists
from worker import check
from worker.local.backend import create_registry_table

CALLBACK = "https://abcdef1234.execute-api.us-east-1.amazonaws.com/prod"
SETTINGS_ENV = (
    "SESSION_TABLE",
    "SCRATCH_BUCKET",
    "SCRATCH_ROOT",
    "KMS_KEY_ID",
    "WS_CALLBACK_URL",
    "ATTR_TTL",
    "BACKLOG_QUEUE_URL",
    "INTEGRITY_KEY_ID",
)
REGISTRY_ENV = ("REGISTRY_TABLE", "REGISTRY_CONNECTION_INDEX", "ATTR_REGISTRY_CONNECTION_ID")


@pytest.fixture(autouse=True)
def _no_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SETTINGS_ENV + REGISTRY_ENV:
        monkeypatch.delenv(name, raising=False)


def add_backstop(stack: SessionStack, prefix: str = "sessions/", *, noncurrent: bool = True) -> None:
    rules: list[dict[str, Any]] = [
        {"ID": "expire-current", "Status": "Enabled", "Filter": {"Prefix": prefix}, "Expiration": {"Days": 7}}
    ]
    if noncurrent:
        rules.append(
            {
                "ID": "expire-versions",
                "Status": "Enabled",
                "Filter": {"Prefix": prefix},
                "NoncurrentVersionExpiration": {"NoncurrentDays": 7},
                "Expiration": {"ExpiredObjectDeleteMarker": True},
            }
        )
    stack.s3.put_bucket_lifecycle_configuration(Bucket=stack.bucket, LifecycleConfiguration={"Rules": rules})


def run(stack: SessionStack, capsys: pytest.CaptureFixture[str], **overrides: str | None) -> tuple[int, list[str]]:
    options: dict[str, str | None] = {
        "--table-name": stack.table,
        "--bucket": stack.bucket,
        "--kms-key-id": stack.key_arn,
        "--callback-url": CALLBACK,
    }
    options.update({f"--{name.replace('_', '-')}": value for name, value in overrides.items()})
    argv = [part for option, value in options.items() if value is not None for part in (option, value)]
    parser = argparse.ArgumentParser()
    check.add_arguments(parser)
    code = check.main(parser.parse_args(argv))
    return code, capsys.readouterr().out.splitlines()


def failures(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("FAIL")]


def new_table(stream_view: str | None) -> str:
    ddb = client("dynamodb")
    name = f"other-{stream_view or 'nostream'}".lower().replace("_", "-")
    if table_exists(ddb, name):
        return name
    spec = {"StreamEnabled": True, "StreamViewType": stream_view} if stream_view else {"StreamEnabled": False}
    ddb.create_table(
        TableName=name,
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification=spec,
    )
    ddb.update_time_to_live(TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": "ttl"})
    return name


def test_a_correct_stack_passes_every_check(stack: SessionStack, capsys: pytest.CaptureFixture[str]) -> None:
    add_backstop(stack)

    code, lines = run(stack, capsys)

    assert code == 0
    assert len(lines) == 8  # with the binding's sample: an empty table has nothing to sample yet
    assert all(line.startswith("ok ") for line in lines), lines


def test_ttl_disabled_fails_with_the_command_that_enables_it(
    stack: SessionStack, capsys: pytest.CaptureFixture[str]
) -> None:
    add_backstop(stack)
    stack.ddb.update_time_to_live(
        TableName=stack.table, TimeToLiveSpecification={"Enabled": False, "AttributeName": "ttl"}
    )

    code, lines = run(stack, capsys)

    assert code == 2
    [line] = failures(lines)
    assert "TTL enabled on 'ttl'" in line and "update-time-to-live" in line


def test_ttl_on_another_attribute_fails(stack: SessionStack, capsys: pytest.CaptureFixture[str]) -> None:
    add_backstop(stack)

    code, lines = run(stack, capsys, ttl_attribute="expiresAt")

    assert code == 2
    [line] = failures(lines)
    assert "TTL is on 'ttl'" in line and "ATTR_TTL=ttl" in line


@pytest.mark.parametrize(("view", "expected"), [("KEYS_ONLY", "view type KEYS_ONLY"), (None, "no stream")])
def test_a_stream_without_the_old_image_fails(
    stack: SessionStack, capsys: pytest.CaptureFixture[str], view: str | None, expected: str
) -> None:
    add_backstop(stack)

    code, lines = run(stack, capsys, table_name=new_table(view))

    assert code == 2
    [line] = failures(lines)
    assert line.startswith("FAIL stream enabled") and expected in line and "NEW_AND_OLD_IMAGES" in line


def test_a_missing_table_fails_its_three_checks(stack: SessionStack, capsys: pytest.CaptureFixture[str]) -> None:
    add_backstop(stack)

    code, lines = run(stack, capsys, table_name="no-such-table")

    assert code == 2
    assert [line.split(":")[0] for line in failures(lines)] == [
        "FAIL session table exists",
        "FAIL TTL enabled on 'ttl'",
        "FAIL stream enabled with an old image",
    ]


def test_a_missing_bucket_fails_bucket_and_lifecycle(stack: SessionStack, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = run(stack, capsys, bucket="no-such-bucket-anywhere")

    assert code == 2
    assert [line.split(":")[0] for line in failures(lines)] == [
        "FAIL scratch bucket exists",
        "FAIL lifecycle backstop covers 'sessions/'",
    ]


def test_a_bucket_without_lifecycle_fails_the_backstop(stack: SessionStack, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = run(stack, capsys)

    assert code == 2
    [line] = failures(lines)
    assert "no lifecycle configuration" in line and "NoncurrentVersionExpiration" in line


def test_a_backstop_on_another_prefix_does_not_cover_the_root(
    stack: SessionStack, capsys: pytest.CaptureFixture[str]
) -> None:
    add_backstop(stack, prefix="uploads/")

    code, lines = run(stack, capsys)

    assert code == 2
    [line] = failures(lines)
    assert "expires current or noncurrent versions" in line


def test_a_backstop_without_noncurrent_expiry_fails(stack: SessionStack, capsys: pytest.CaptureFixture[str]) -> None:
    add_backstop(stack, noncurrent=False)

    code, lines = run(stack, capsys)

    assert code == 2
    [line] = failures(lines)
    assert "expires noncurrent versions" in line


def test_a_disabled_key_fails_with_enable_key(stack: SessionStack, capsys: pytest.CaptureFixture[str]) -> None:
    add_backstop(stack)
    stack.kms.disable_key(KeyId=stack.key_arn.rsplit("/", 1)[1])  # moto takes only the bare id here

    code, lines = run(stack, capsys)

    assert code == 2
    [line] = failures(lines)
    assert "key state Disabled" in line and "enable-key" in line


def test_a_key_given_by_id_fails_because_retire_grant_needs_the_arn(
    stack: SessionStack, capsys: pytest.CaptureFixture[str]
) -> None:
    add_backstop(stack)

    code, lines = run(stack, capsys, kms_key_id=stack.key_arn.rsplit("/", 1)[1])

    assert code == 2
    [line] = failures(lines)
    assert f"KMS_KEY_ID={stack.key_arn}" in line


def test_no_callback_url_fails(stack: SessionStack, capsys: pytest.CaptureFixture[str]) -> None:
    add_backstop(stack)

    code, lines = run(stack, capsys, callback_url=None)

    assert code == 2
    [line] = failures(lines)
    assert line.startswith("FAIL callback endpoint set") and "WS_CALLBACK_URL=" in line


def test_a_dead_letter_prefix_under_the_scratch_root_fails_with_its_fix(
    stack: SessionStack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    add_backstop(stack)
    monkeypatch.setenv("SCRATCH_BUCKET", stack.bucket)  # the worker itself refuses to start with these settings
    monkeypatch.setenv("DEAD_LETTER_PREFIX", "sessions/dead-letter/")

    code, lines = run(stack, capsys)

    assert code == 2
    [line] = failures(lines)
    assert line.startswith(
        "FAIL dead-letter objects outside the scratch root: DEAD_LETTER_PREFIX 'sessions/dead-letter/'"
    )
    assert "-- fix: set DEAD_LETTER_PREFIX to a prefix outside the root" in line


def test_a_scratch_root_given_over_the_dead_letter_prefix_fails(
    stack: SessionStack, capsys: pytest.CaptureFixture[str]
) -> None:
    add_backstop(stack, prefix="dead-letter/")

    code, lines = run(stack, capsys, scratch_root="dead-letter/")

    assert code == 2
    [line] = failures(lines)
    assert "DEAD_LETTER_PREFIX 'dead-letter/' overlaps SCRATCH_ROOT 'dead-letter/'" in line


def test_the_dead_letter_store_is_checked_when_a_queue_is_set(
    stack: SessionStack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    add_backstop(stack)
    monkeypatch.setenv("DEAD_LETTER_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/dlq")
    monkeypatch.setenv("DEAD_LETTER_BUCKET", "no-such-dead-letter-bucket")

    code, lines = run(stack, capsys)

    assert code == 2
    [line] = failures(lines)
    assert line.startswith("FAIL dead-letter objects outside the scratch root: no-such-dead-letter-bucket not found")


@pytest.mark.parametrize("key", [None, "arn:aws:kms:us-east-1:123456789012:key/mac"])
def test_a_backlog_without_the_integrity_key_fails_since_the_drain_would_refuse_its_messages(
    stack: SessionStack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, key: str | None
) -> None:
    add_backstop(stack)
    monkeypatch.setenv("BACKLOG_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/backlog")
    if key:
        monkeypatch.setenv("INTEGRITY_KEY_ID", key)

    code, lines = run(stack, capsys)

    tagged = [line for line in lines if "backlog messages tagged" in line]
    if key:
        assert (code, tagged) == (0, [f"ok   backlog messages tagged for the drain: {key}"])
    else:
        assert code == 2
        assert tagged == failures(lines)
        assert "BACKLOG_QUEUE_URL without INTEGRITY_KEY_ID -- fix: set INTEGRITY_KEY_ID" in tagged[0]


def test_a_registry_with_its_connection_index_passes(stack: SessionStack, capsys: pytest.CaptureFixture[str]) -> None:
    add_backstop(stack)
    create_registry_table(stack.ddb, f"registry-{stack.table}")

    code, lines = run(stack, capsys, registry_table=f"registry-{stack.table}")

    assert code == 0
    assert (
        f"ok   registry index on 'connectionId' projects the table's keys: registry-{stack.table}/byConnection: "
        "keys pk, sk (KEYS_ONLY)" in lines
    )


def test_a_registry_without_the_index_fails_with_how_to_add_it(
    stack: SessionStack, capsys: pytest.CaptureFixture[str]
) -> None:
    add_backstop(stack)
    create_registry_table(stack.ddb, f"registry-{stack.table}", index="byRoom")

    code, lines = run(stack, capsys, registry_table=f"registry-{stack.table}")

    assert code == 2
    [line] = failures(lines)
    assert "has no index 'byConnection'" in line and "partition key 'connectionId'" in line


def test_a_registry_index_on_another_attribute_fails(
    stack: SessionStack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    add_backstop(stack)
    create_registry_table(stack.ddb, f"registry-{stack.table}")
    monkeypatch.setenv("ATTR_REGISTRY_CONNECTION_ID", "userId")

    code, lines = run(stack, capsys, registry_table=f"registry-{stack.table}")

    assert code == 2
    [line] = failures(lines)
    assert "is keyed on 'connectionId'" in line and "ATTR_REGISTRY_CONNECTION_ID=connectionId" in line


def test_a_missing_registry_table_fails(stack: SessionStack, capsys: pytest.CaptureFixture[str]) -> None:
    add_backstop(stack)

    code, lines = run(stack, capsys, registry_table="no-such-registry")

    assert code == 2
    [line] = failures(lines)
    assert "no-such-registry not found" in line and "REGISTRY_TABLE" in line
