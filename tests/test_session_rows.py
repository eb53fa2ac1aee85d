"""A connection table whose partition holds more than the session row (``pk = <connection id>``, ``sk = metadata``).

Every row of such a partition carries the connection id in its key, so with ``ATTR_CONNECTION_ID=pk`` any of them
looks like a session; ``SESSION_SORT_KEY`` says which row is the session.
"""

from __future__ import annotations

import time

from cleanup.queues.reporting import run_batch
from schemas.outcomes import Status
from schemas.records import read_lambda_event
from tests.stack import SessionStack
from worker.local.gateway import LocalGateway

CONNECTION_TABLE = {"attributes": {"connection_id": "pk", "ttl": "expires_at"}, "session_sort_key": "metadata"}


def connection_rows(stack: SessionStack, connection_id: str) -> None:
    """The session row and two other rows of the same connection, as the gateway of seed 003 writes them."""
    expires = int(time.time()) + 3600
    stack.put_item({"pk": connection_id, "sk": "metadata", "user_id": "u1", "expires_at": expires})
    stack.put_item({"pk": connection_id, "sk": "subscription#room-1", "expires_at": expires})
    stack.put_item({"pk": connection_id, "sk": "presence", "expires_at": expires})


def remove(stack: SessionStack, connection_id: str, sort_key: str) -> None:
    stack.ddb.delete_item(TableName=stack.table, Key={"pk": {"S": connection_id}, "sk": {"S": sort_key}})


def clean(stack: SessionStack, gateway: LocalGateway, **settings: object):
    runtime = stack.runtime(ws_callback_url=gateway.callback_url, **settings)
    return [o for o in run_batch(read_lambda_event(stack.lambda_event()), runtime) if o.event_name == "REMOVE"]


def test_deleting_another_row_of_a_live_connection_leaves_its_socket_open(
    stack: SessionStack, gateway: LocalGateway
) -> None:
    client = gateway.connect()
    connection_rows(stack, client.connection_id)
    remove(stack, client.connection_id, "subscription#room-1")
    remove(stack, client.connection_id, "presence")

    outcomes = clean(stack, gateway, **CONNECTION_TABLE)

    assert [o.status for o in outcomes] == [Status.SKIPPED, Status.SKIPPED]
    assert all("sort key" in (o.skip_reason or "") for o in outcomes)
    assert not client.wait_closed(0.5)
    assert gateway.is_open(client.connection_id)


def test_deleting_the_session_row_closes_the_socket(stack: SessionStack, gateway: LocalGateway) -> None:
    client = gateway.connect()
    connection_rows(stack, client.connection_id)
    remove(stack, client.connection_id, "metadata")

    [outcome] = clean(stack, gateway, **CONNECTION_TABLE)

    assert outcome.status is Status.CLEANED
    assert client.wait_closed(5.0)


def test_without_a_session_sort_key_every_row_counts_as_the_session(stack: SessionStack, gateway: LocalGateway) -> None:
    client = gateway.connect()
    connection_rows(stack, client.connection_id)
    remove(stack, client.connection_id, "presence")

    [outcome] = clean(stack, gateway, attributes=CONNECTION_TABLE["attributes"])

    assert outcome.status is Status.CLEANED  # why SESSION_SORT_KEY is needed on such a table
    assert client.wait_closed(5.0)
