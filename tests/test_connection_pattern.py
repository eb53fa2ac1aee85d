"""A table keyed by the connection (``pk = conn#<id>``, ``sk = metadata``, TTL on ``expires_at``, as in the design
whose gateway writes one row per connection): CONNECTION_ID_PATTERN reads the connection id inside the key."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from cleanup.queues.reporting import run_batch
from schemas.outcomes import Status
from schemas.records import read_lambda_event
from schemas.settings import Settings, configuration_problems
from tests.stack import SessionStack
from worker.local.gateway import LocalGateway

PATTERN = r"^conn#(?P<id>.+)$"
CONNECTION_TABLE = {
    "attributes": {"connection_id": "pk", "ttl": "expires_at"},
    "session_sort_key": "metadata",
    "connection_id_pattern": PATTERN,
    "session_binding": False,  # these rows' grants and prefixes are not named after the connection: not the point here
}


def connection_row(stack: SessionStack, key: str, prefix: str) -> str:
    """The connection's session row, with a grant and scratch data; returns the grant id."""
    grant_id = stack.kms.create_grant(
        KeyId=stack.key_arn, GranteePrincipal="arn:aws:iam::123456789012:role/agent", Operations=["Decrypt"]
    )["GrantId"]
    for n in range(3):
        stack.s3.put_object(Bucket=stack.bucket, Key=f"{prefix}part-{n}", Body=b"scratch")
    expires = int(time.time()) + 3600
    row = {"pk": key, "sk": "metadata", "expires_at": expires, "grantId": grant_id, "scratchPrefix": prefix}
    stack.put_item(row)
    return str(grant_id)


def end(stack: SessionStack, key: str) -> None:
    stack.ddb.delete_item(TableName=stack.table, Key={"pk": {"S": key}, "sk": {"S": "metadata"}})


def clean(stack: SessionStack, gateway: LocalGateway, **settings: object):
    runtime = stack.runtime(ws_callback_url=gateway.callback_url, **settings)
    return [o for o in run_batch(read_lambda_event(stack.lambda_event()), runtime) if o.event_name == "REMOVE"]


def test_the_id_inside_the_key_closes_its_socket_and_frees_the_rest(stack: SessionStack, gateway: LocalGateway) -> None:
    ended, live = gateway.connect(), gateway.connect()
    grant_id = connection_row(stack, f"conn#{ended.connection_id}", "sessions/t1/a/")
    live_grant = connection_row(stack, f"conn#{live.connection_id}", "sessions/t1/b/")
    end(stack, f"conn#{ended.connection_id}")

    [outcome] = clean(stack, gateway, **CONNECTION_TABLE)

    assert outcome.status is Status.CLEANED, outcome
    assert ended.wait_closed(5.0)
    assert gateway.is_open(live.connection_id)
    assert grant_id not in stack.grant_ids() and live_grant in stack.grant_ids()
    assert stack.objects("sessions/t1/a/") == [] and len(stack.objects("sessions/t1/b/")) == 3


def test_a_value_the_pattern_does_not_match_fails_permanently_and_reaches_no_socket(
    stack: SessionStack, gateway: LocalGateway
) -> None:
    client = gateway.connect()
    grant_id = connection_row(stack, f"connection-{client.connection_id}", "sessions/t1/a/")
    end(stack, f"connection-{client.connection_id}")

    [outcome] = clean(stack, gateway, **CONNECTION_TABLE)

    assert outcome.status is Status.FAILED and outcome.permanent
    [closing] = [action for action in outcome.actions if action.action == "connection"]
    assert "CONNECTION_ID_PATTERN" in (closing.error or "") and "redrive" in (closing.error or "")
    assert not client.wait_closed(0.5) and gateway.is_open(client.connection_id)
    assert grant_id not in stack.grant_ids()  # the record's other resources are still freed


def test_without_the_pattern_the_key_is_sent_whole_and_the_socket_stays_open(
    stack: SessionStack, gateway: LocalGateway
) -> None:
    client = gateway.connect()
    connection_row(stack, f"conn#{client.connection_id}", "sessions/t1/a/")
    end(stack, f"conn#{client.connection_id}")

    clean(stack, gateway, **{**CONNECTION_TABLE, "connection_id_pattern": None})

    assert gateway.is_open(client.connection_id)  # API Gateway answers 410 for "conn#<id>": why the pattern exists


@pytest.mark.parametrize(
    ("pattern", "why"),
    [(r"^conn#(.+)$", "named group 'id'"), (r"^conn#(?P<id>.+$", "not a regular expression")],
)
def test_a_pattern_without_an_id_group_is_refused_at_start_in_one_line(pattern: str, why: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(connection_id_pattern=pattern)

    problems = configuration_problems(refused.value)
    assert list(problems) == ["CONNECTION_ID_PATTERN"] and why in problems["CONNECTION_ID_PATTERN"]


def test_a_key_alias_is_refused_at_start_since_retire_grant_needs_the_key_arn() -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(kms_key_id="alias/sessions")

    assert "key's ARN" in configuration_problems(refused.value)["KMS_KEY_ID"]
