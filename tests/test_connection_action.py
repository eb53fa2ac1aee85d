"""Closing a session's socket through the local gateway: the action's meanings, botocore's retries, the handler."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import boto3
import pytest
from botocore.config import Config

from cleanup.actions.connection import close_connection
from cleanup.deadline import Deadline
from cleanup.exceptions import PermanentError, TransientError
from cleanup.queues.reporting import run_batch
from schemas.outcomes import ActionStatus, Status
from schemas.records import read_lambda_event
from tests.faults import Faults
from tests.stack import SessionStack, unfenced
from worker import lambda_handler
from worker.local.gateway import LocalGateway

ManagementFactory = Callable[[int], Any]


@pytest.fixture
def management(gateway: LocalGateway, monkeypatch: pytest.MonkeyPatch) -> ManagementFactory:
    """A real apigatewaymanagementapi client at the gateway, with botocore standard retries of ``attempts`` tries."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")

    def make(attempts: int) -> Any:
        config = Config(retries={"mode": "standard", "total_max_attempts": attempts})
        return boto3.client(
            "apigatewaymanagementapi", endpoint_url=gateway.callback_url, region_name="us-east-1", config=config
        )

    return make


def test_closing_a_live_connection_is_done_and_closes_the_socket(
    gateway: LocalGateway, management: ManagementFactory
) -> None:
    client = gateway.connect()

    status = close_connection(management(1), client.connection_id, permit=unfenced)

    assert status is ActionStatus.DONE
    assert client.wait_closed(timeout=5)
    assert not gateway.is_open(client.connection_id)


def test_closing_it_again_is_already_done(gateway: LocalGateway, management: ManagementFactory) -> None:
    client = gateway.connect()
    close_connection(management(1), client.connection_id, permit=unfenced)

    status = close_connection(management(1), client.connection_id, permit=unfenced)

    assert status is ActionStatus.ALREADY_DONE


def test_a_connection_the_client_left_is_already_done(gateway: LocalGateway, management: ManagementFactory) -> None:
    client = gateway.connect()
    client.close()
    assert gateway.wait_gone(client.connection_id, timeout=5)

    status = close_connection(management(1), client.connection_id, permit=unfenced)

    assert status is ActionStatus.ALREADY_DONE


def test_forbidden_is_permanent_and_leaves_the_socket_open(
    gateway: LocalGateway, management: ManagementFactory
) -> None:
    client = gateway.connect()
    gateway.fail_next(1, status=403, error_type="ForbiddenException")

    with pytest.raises(PermanentError, match="ForbiddenException"):
        close_connection(management(3), client.connection_id, permit=unfenced)

    assert gateway.is_open(client.connection_id)
    client.close()


@pytest.mark.parametrize(
    ("status", "error_type"),
    [(429, "LimitExceededException"), (429, "TooManyRequestsException"), (500, "InternalServerErrorException")],
)
def test_throttling_and_server_errors_are_transient(
    gateway: LocalGateway, management: ManagementFactory, status: int, error_type: str
) -> None:
    client = gateway.connect()
    gateway.fail_next(1, status=status, error_type=error_type)

    with pytest.raises(TransientError, match=error_type):
        close_connection(management(1), client.connection_id, permit=unfenced)

    assert gateway.is_open(client.connection_id)
    client.close()


def test_botocore_standard_retries_absorb_one_server_error(
    gateway: LocalGateway, management: ManagementFactory
) -> None:
    client = gateway.connect()
    calls_before = gateway.delete_calls
    gateway.fail_next(1, status=500)

    status = close_connection(management(3), client.connection_id, permit=unfenced)

    assert status is ActionStatus.DONE
    assert gateway.delete_calls == calls_before + 2
    assert client.wait_closed(timeout=5)


def test_the_handler_closes_the_deleted_sessions_socket_only(stack: SessionStack, gateway: LocalGateway) -> None:
    expired, live = gateway.connect(), gateway.connect()
    stack.put_session("gone", connection_id=expired.connection_id)
    stack.put_session("live", connection_id=live.connection_id)
    stack.delete("gone")
    event = stack.lambda_event()
    with lambda_handler.warm.use(stack.runtime(ws_callback_url=gateway.callback_url)):
        result = lambda_handler.handler(event, None)

    assert result == {"batchItemFailures": []}
    assert expired.wait_closed(timeout=5)
    assert not gateway.is_open(expired.connection_id)
    assert gateway.is_open(live.connection_id)
    assert not live.closed
    live.close()


def test_delivering_the_same_event_again_reports_no_failure(stack: SessionStack, gateway: LocalGateway) -> None:
    expired, live = gateway.connect(), gateway.connect()
    stack.put_session("gone", connection_id=expired.connection_id)
    stack.put_session("live", connection_id=live.connection_id)
    stack.delete("gone")
    event = stack.lambda_event()
    with lambda_handler.warm.use(stack.runtime(ws_callback_url=gateway.callback_url)):
        lambda_handler.handler(event, None)
        calls_before = gateway.delete_calls

        result = lambda_handler.handler(event, None)

    assert result == {"batchItemFailures": []}
    assert gateway.delete_calls == calls_before + 1  # asked again, answered 410 Gone: already closed
    assert gateway.is_open(live.connection_id)
    live.close()


def test_an_items_own_allowed_callback_url_is_used(stack: SessionStack, gateway: LocalGateway) -> None:
    client = gateway.connect()
    stack.put_session("own", connection_id=client.connection_id, extra={"callbackUrl": gateway.callback_url})
    stack.delete("own")
    runtime = stack.runtime(ws_callback_url=None, allowed_callback_urls=gateway.callback_url)

    outcome = run_batch(read_lambda_event(stack.lambda_event()), runtime)[-1]

    assert outcome.status is Status.CLEANED
    assert client.wait_closed(timeout=5)


def test_an_items_callback_url_that_is_not_allowed_gets_no_request(stack: SessionStack, gateway: LocalGateway) -> None:
    client = gateway.connect()
    stack.put_session("rogue", connection_id=client.connection_id, extra={"callbackUrl": gateway.callback_url})
    stack.delete("rogue")
    calls_before = gateway.delete_calls

    outcome = run_batch(read_lambda_event(stack.lambda_event()), stack.runtime(ws_callback_url=None))[-1]

    assert outcome.status is Status.FAILED and outcome.permanent
    assert "ALLOWED_CALLBACK_URLS" in (outcome.error or "")
    assert gateway.delete_calls == calls_before
    assert gateway.is_open(client.connection_id)
    client.close()


def test_a_final_answer_near_the_deadline_is_the_answer_not_out_of_time(
    stack: SessionStack, gateway: LocalGateway
) -> None:
    # 1.2 s left: enough to send, not enough for botocore to try again. A 410 means already closed, and access
    # denied means a fix is needed: neither is "out of time", which would only try it again on the next delivery.
    management = stack.runtime(ws_callback_url=gateway.callback_url).clients.management(gateway.callback_url)

    gone = close_connection(management, "conn-never-open", Deadline.after(1.2), permit=unfenced)

    assert gone is ActionStatus.ALREADY_DONE
    Faults(management, "DeleteConnection", "AccessDeniedException", status=403)
    with pytest.raises(PermanentError, match="AccessDenied"):
        close_connection(management, "conn-never-open", Deadline.after(1.2), permit=unfenced)
