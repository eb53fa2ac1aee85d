"""The key a grant is retired on: KMS_KEY_ID or one of ALLOWED_KMS_KEY_IDS, never whatever key an item names.

RetireGrant is authorised by the grant (its retiring principal), not by IAM, so the worker's own check is what keeps
an item from retiring another key's grant that also names the worker as retiring principal.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from cleanup.core.guard import grant_key
from cleanup.exceptions import MissingConfigError, RefusedKeyError
from cleanup.queues.reporting import run_batch
from schemas.outcomes import ActionStatus, Status
from schemas.records import read_lambda_event
from schemas.settings import Settings, configuration_problems
from tests.stack import SessionStack

KEY = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
OLD_KEY = "arn:aws:kms:us-east-1:123456789012:key/mrk-0123456789abcdef0123456789abcdef"


def other_key(stack: SessionStack) -> str:
    """A second key in the account, whose grants also name the worker as retiring principal."""
    return str(stack.kms.create_key(Description=f"another app's key, {stack.table}")["KeyMetadata"]["Arn"])


def grant_on(stack: SessionStack, key_arn: str, session_id: str) -> str:
    return str(
        stack.kms.create_grant(
            KeyId=key_arn,
            GranteePrincipal="arn:aws:iam::123456789012:role/agent",
            Operations=["Decrypt"],
            Name=f"session:{session_id}",
        )["GrantId"]
    )


def grants_of(stack: SessionStack, key_arn: str) -> set[str]:
    return {g["GrantId"] for g in stack.kms.list_grants(KeyId=key_arn)["Grants"]}


def end_session_on(stack: SessionStack, session_id: str, key_arn: str) -> dict[str, Any]:
    """A session whose item names ``key_arn`` and a grant on it; the item is then deleted."""
    item = stack.put_session(
        session_id, grant=False, extra={"grantId": grant_on(stack, key_arn, session_id), "kmsKeyId": key_arn}
    )
    stack.delete(session_id)
    return item


def test_a_grant_on_a_key_that_is_not_allowed_is_kept_and_the_record_fails_permanently(stack: SessionStack) -> None:
    key = other_key(stack)
    item = end_session_on(stack, "other", key)

    outcome = run_batch(read_lambda_event(stack.lambda_event()), stack.runtime())[-1]

    grant = {a.action: a for a in outcome.actions}["grant"]
    assert item["grantId"] in grants_of(stack, key)  # the other key's grant is still usable
    assert outcome.status is Status.FAILED and outcome.permanent
    assert grant.status is ActionStatus.FAILED and grant.detail.get("refused") is True
    assert key in (grant.error or "") and "ALLOWED_KMS_KEY_IDS" in (grant.error or "")
    assert stack.objects(item["scratchPrefix"]) == []  # the record's other actions still ran


def test_only_the_grants_of_the_keys_listed_in_allowed_kms_key_ids_are_retired(stack: SessionStack) -> None:
    listed, unlisted = other_key(stack), other_key(stack)
    retired = end_session_on(stack, "listed", listed)
    kept = end_session_on(stack, "unlisted", unlisted)

    outcomes = run_batch(read_lambda_event(stack.lambda_event()), stack.runtime(allowed_kms_key_ids=listed))

    status = {o.key: o.status for o in outcomes if o.event_name == "REMOVE"}
    assert retired["grantId"] not in grants_of(stack, listed)
    assert kept["grantId"] in grants_of(stack, unlisted)
    assert sorted(status.values()) == sorted([Status.CLEANED, Status.FAILED])


def test_the_configured_key_keeps_working_whether_the_item_names_it_or_not(stack: SessionStack) -> None:
    named = stack.put_session("named", extra={"kmsKeyId": stack.key_arn})
    unnamed = stack.put_session("unnamed")
    bare = stack.put_session("bare", extra={"kmsKeyId": stack.key_arn.rsplit("/", 1)[1]})  # the same key, not an ARN
    for session_id in ("named", "unnamed", "bare"):
        stack.delete(session_id)

    outcomes = run_batch(read_lambda_event(stack.lambda_event()), stack.runtime())

    assert {named["grantId"], unnamed["grantId"]}.isdisjoint(stack.grant_ids())
    assert bare["grantId"] in stack.grant_ids()  # a key id that is not an ARN cannot be compared: refused
    failed = [o for o in outcomes if o.status is Status.FAILED]
    assert len(failed) == 1 and failed[0].permanent and "not a key ARN" in (failed[0].error or "")


@pytest.mark.parametrize(
    ("item_key", "settings", "expected"),
    [
        (None, Settings(kms_key_id=KEY), KEY),
        ("", Settings(kms_key_id=KEY), KEY),
        (KEY, Settings(kms_key_id=KEY), KEY),
        (OLD_KEY, Settings(kms_key_id=KEY, allowed_kms_key_ids=f" {OLD_KEY} ,"), OLD_KEY),
        (OLD_KEY, Settings(allowed_kms_key_ids=OLD_KEY), OLD_KEY),
    ],
)
def test_the_grant_key_is_the_configured_one_or_an_allowed_one(
    item_key: str | None, settings: Settings, expected: str
) -> None:
    assert grant_key(item_key, settings) == expected


@pytest.mark.parametrize(
    "item_key",
    [
        OLD_KEY,  # another key of the account
        KEY.replace("123456789012", "210987654321"),  # the same key id in another account
        KEY.upper(),  # compared exactly
        f"{KEY} ",
        KEY.rsplit("/", 1)[1],  # the configured key's bare id
        "alias/sessions",
        "arn:aws:kms:us-east-1:123456789012:alias/sessions",
    ],
)
def test_an_item_cannot_name_another_key_for_the_worker_to_retire_a_grant_on(item_key: str) -> None:
    with pytest.raises(RefusedKeyError, match="ALLOWED_KMS_KEY_IDS"):
        grant_key(item_key, Settings(kms_key_id=KEY))


def test_a_grant_with_no_key_at_all_is_a_configuration_error() -> None:
    with pytest.raises(MissingConfigError, match="KMS_KEY_ID"):
        grant_key(None, Settings(allowed_kms_key_ids=KEY))


@pytest.mark.parametrize("value", ["alias/sessions", f"{KEY},1234abcd-12ab-34cd-56ef-1234567890ab"])
def test_allowed_kms_key_ids_must_be_key_arns(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALLOWED_KMS_KEY_IDS", value)

    with pytest.raises(ValidationError) as error:
        Settings.from_env()

    problems = configuration_problems(error.value)
    assert set(problems) == {"ALLOWED_KMS_KEY_IDS"} and "must list key ARNs" in problems["ALLOWED_KMS_KEY_IDS"]
