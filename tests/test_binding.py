"""A session's grant and scratch prefix are freed only when they are bound to it (SESSION_BINDING, ``own`` by
default; ``strict`` here where it differs): the grant's Name is ``session:<id>`` and the prefix ends in ``<id>/``, the
id being the item key's (tests/test_binding_default.py: what ``own`` frees besides).

Whoever can write the session table (or invoke the functions directly) can otherwise name another live session's
resources in an item they then delete.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from cleanup.application_contract import create_session
from cleanup.queues.reporting import run_batch
from schemas.outcomes import ActionResult, ActionStatus, Status
from schemas.records import read_lambda_event
from tests.stack import SessionStack
from worker.local.gateway import LocalGateway


def named_grant(stack: SessionStack, name: str | None) -> str:
    extra = {} if name is None else {"Name": name}
    return str(
        stack.kms.create_grant(
            KeyId=stack.key_arn,
            GranteePrincipal="arn:aws:iam::123456789012:role/agent",
            Operations=["Decrypt"],
            **extra,
        )["GrantId"]
    )


def actions(stack: SessionStack, **settings: Any) -> tuple[Status, bool, dict[str, ActionResult]]:
    outcome = run_batch(read_lambda_event(stack.lambda_event()), stack.runtime(**settings))[-1]
    return outcome.status, outcome.permanent, {result.action: result for result in outcome.actions}


def test_a_grant_named_for_its_own_session_is_retired(stack: SessionStack) -> None:
    grant_id = named_grant(stack, "session:own")
    stack.put_session("own", grant=False, extra={"grantId": grant_id})
    stack.delete("own")

    status, _, done = actions(stack)

    assert status is Status.CLEANED and done["grant"].status is ActionStatus.DONE
    assert grant_id not in stack.grant_ids()


@pytest.mark.parametrize("name", ["session:victim", None, "session:own-2"])
def test_a_grant_not_named_for_the_session_is_kept_and_the_record_fails_permanently(
    stack: SessionStack, name: str | None
) -> None:
    victims = named_grant(stack, name)  # another live session's grant, named in the deleted item
    item = stack.put_session("own", grant=False, extra={"grantId": victims})
    stack.delete("own")

    status, permanent, done = actions(stack)

    assert victims in stack.grant_ids()
    assert status is Status.FAILED and permanent
    assert done["grant"].status is ActionStatus.FAILED and done["grant"].permanent
    assert "SESSION_BINDING" in (done["grant"].error or "")
    assert name is None or "session:own" in (done["grant"].error or "")
    assert stack.objects(item["scratchPrefix"]) == []  # its own scratch data is still freed


def test_a_grant_that_is_no_longer_listed_is_already_retired(stack: SessionStack) -> None:
    grant_id = named_grant(stack, "session:own")
    stack.put_session("own", grant=False, extra={"grantId": grant_id})
    stack.kms.retire_grant(KeyId=stack.key_arn, GrantId=grant_id)
    stack.delete("own")

    status, _, done = actions(stack)

    assert status is Status.CLEANED and done["grant"].status is ActionStatus.ALREADY_DONE


@pytest.mark.parametrize("prefix", ["sessions/t1/victim/", "sessions/t1/own/victim/", "sessions/t1/own-2/"])
def test_a_scratch_prefix_not_ending_in_the_session_id_is_kept_and_the_record_fails_permanently(
    stack: SessionStack, prefix: str
) -> None:
    stack.put_objects([f"{prefix}part-0"])
    grant_id = named_grant(stack, "session:own")
    stack.put_session("own", grant=False, objects=0, extra={"scratchPrefix": prefix, "grantId": grant_id})
    stack.delete("own")

    status, permanent, done = actions(stack)

    assert stack.objects(prefix) == [f"{prefix}part-0"]
    assert status is Status.FAILED and permanent and done["scratch"].detail.get("refused") is True
    assert "own" in (done["scratch"].error or "") and "SESSION_BINDING" in (done["scratch"].error or "")
    assert grant_id not in stack.grant_ids()  # its own grant is still freed


def test_strictly_an_item_whose_key_names_no_session_id_frees_neither_grant_nor_scratch(stack: SessionStack) -> None:
    grant_id = named_grant(stack, "session:own")
    stack.put_objects(["sessions/t1/own/part-0"])
    item = {"pk": "user#own", "sk": "meta", "tenantId": "t1", "scratchPrefix": "sessions/t1/own/", "grantId": grant_id}
    stack.put_item(item)
    stack.ddb.delete_item(TableName=stack.table, Key={"pk": {"S": "user#own"}, "sk": {"S": "meta"}})

    _, permanent, done = actions(stack, session_binding="strict")

    assert permanent and done["grant"].status is ActionStatus.FAILED and done["scratch"].status is ActionStatus.FAILED
    assert grant_id in stack.grant_ids() and stack.objects("sessions/t1/own/") == ["sessions/t1/own/part-0"]


def test_with_the_binding_off_unbound_resources_are_freed(stack: SessionStack) -> None:
    grant_id = named_grant(stack, None)
    stack.put_objects(["sessions/t1/other/part-0"])
    stack.put_session("own", grant=False, objects=0, extra={"grantId": grant_id, "scratchPrefix": "sessions/t1/other/"})
    stack.delete("own")

    status, _, _ = actions(stack, session_binding=False)

    assert status is Status.CLEANED
    assert grant_id not in stack.grant_ids() and stack.objects("sessions/t1/other/") == []


def test_the_write_path_refuses_a_scratch_prefix_that_is_not_the_sessions_own(stack: SessionStack) -> None:
    with pytest.raises(ValueError, match="own"):
        create_session(
            stack.ddb, stack.table, "own", tenant_id="t1", scratch_prefix="sessions/t1/victim/", ttl_seconds=60
        )

    assert "Item" not in stack.ddb.get_item(TableName=stack.table, Key=stack.key("own"))


def test_a_session_back_before_a_late_grant_name_is_answered_keeps_its_grant(
    stack: SessionStack, gateway: LocalGateway
) -> None:
    # The grant's name is asked when the record starts; here its answer comes only after the socket's reading (the
    # one the grant would go on) and the socket's call, while the user comes back: the RetireGrant must read again.
    socket = gateway.connect()
    old = stack.put_session("back", objects=1, connection_id=socket.connection_id)
    stack.delete("back")
    runtime = stack.runtime(ws_callback_url=gateway.callback_url)
    closing = threading.Event()

    def slow_answer(**_: object) -> None:
        closing.wait(timeout=10)
        stack.put_item(old)

    runtime.clients.kms.meta.events.register("before-call.kms.ListGrants", slow_answer)
    management = runtime.clients.management(gateway.callback_url)
    management.meta.events.register("before-call.apigatewaymanagementapi.DeleteConnection", lambda **_: closing.set())

    run_batch(read_lambda_event(stack.lambda_event()), runtime)

    assert closing.is_set() and old["grantId"] in stack.grant_ids()
