"""The local gateway answers boto3's apigatewaymanagementapi client as API Gateway does, over real sockets."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.stack import harness_session
from worker.local.gateway import LocalGateway

UNKNOWN_ID = "AAAAAAAAAAAAAAA="


@pytest.fixture
def management(gateway: LocalGateway, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    # The tests' own client (the gateway itself is under test here, not the worker).
    return harness_session().client(
        "apigatewaymanagementapi",
        endpoint_url=gateway.callback_url,
        region_name="us-east-1",
        config=Config(retries={"mode": "standard", "total_max_attempts": 1}),
    )


def error_code(info: pytest.ExceptionInfo[ClientError]) -> str:
    return str(info.value.response["Error"]["Code"])


def test_a_client_receives_its_connection_id(gateway: LocalGateway) -> None:
    client = gateway.connect()

    assert client.connection_id.endswith("=")
    assert len(client.connection_id) == 16
    assert client.connection_id in gateway.connection_ids()
    assert not client.closed
    client.close()


def test_get_connection_describes_a_live_connection(gateway: LocalGateway, management: Any) -> None:
    client = gateway.connect()

    info = management.get_connection(ConnectionId=client.connection_id)

    assert info["Identity"]["SourceIp"] == "127.0.0.1"
    assert info["ConnectedAt"] <= info["LastActiveAt"]
    client.close()


def test_delete_connection_closes_the_clients_socket(gateway: LocalGateway, management: Any) -> None:
    client = gateway.connect()

    response = management.delete_connection(ConnectionId=client.connection_id)

    assert response["ResponseMetadata"]["HTTPStatusCode"] == 204
    assert client.wait_closed(timeout=5)
    assert client.close_code == 1000
    assert not gateway.is_open(client.connection_id)


def test_deleting_a_closed_connection_again_is_gone(gateway: LocalGateway, management: Any) -> None:
    client = gateway.connect()
    management.delete_connection(ConnectionId=client.connection_id)

    with pytest.raises(ClientError) as info:
        management.delete_connection(ConnectionId=client.connection_id)

    assert error_code(info) == "GoneException"
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 410


@pytest.mark.parametrize("call", ["get_connection", "delete_connection", "post_to_connection"])
def test_an_unknown_connection_is_gone(management: Any, call: str) -> None:
    kwargs: dict[str, Any] = {"ConnectionId": UNKNOWN_ID}
    if call == "post_to_connection":
        kwargs["Data"] = b"hello"

    with pytest.raises(ClientError) as info:
        getattr(management, call)(**kwargs)

    assert error_code(info) == "GoneException"


def test_a_connection_the_client_closed_is_gone(gateway: LocalGateway, management: Any) -> None:
    client = gateway.connect()
    client.close()
    assert gateway.wait_gone(client.connection_id, timeout=5)

    with pytest.raises(ClientError) as info:
        management.get_connection(ConnectionId=client.connection_id)

    assert error_code(info) == "GoneException"


def test_post_to_connection_delivers_the_message(gateway: LocalGateway, management: Any) -> None:
    client = gateway.connect()
    other = gateway.connect()

    management.post_to_connection(ConnectionId=client.connection_id, Data=b'{"bye": true}')

    assert client.receive(timeout=5) == '{"bye": true}'
    assert other.messages.empty()
    client.close()
    other.close()


def test_an_oversized_post_is_refused_and_the_socket_stays_open(gateway: LocalGateway, management: Any) -> None:
    client = gateway.connect()

    with pytest.raises(ClientError) as info:
        management.post_to_connection(ConnectionId=client.connection_id, Data=b"x" * (128 * 1024 + 1))

    assert error_code(info) == "PayloadTooLargeException"
    assert gateway.is_open(client.connection_id)
    client.close()


@pytest.mark.parametrize(
    ("status", "error_type"),
    [(429, "LimitExceededException"), (403, "ForbiddenException"), (500, "InternalServerErrorException")],
)
def test_an_injected_fault_answers_the_next_call_only(
    gateway: LocalGateway, management: Any, status: int, error_type: str
) -> None:
    client = gateway.connect()
    gateway.fail_next(1, status=status, error_type=error_type)

    with pytest.raises(ClientError) as info:
        management.delete_connection(ConnectionId=client.connection_id)

    assert error_code(info) == error_type
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == status
    assert gateway.is_open(client.connection_id)
    management.delete_connection(ConnectionId=client.connection_id)
    assert client.wait_closed(timeout=5)


def test_delete_calls_are_counted(gateway: LocalGateway, management: Any) -> None:
    before = gateway.delete_calls

    with pytest.raises(ClientError):
        management.delete_connection(ConnectionId=UNKNOWN_ID)

    assert gateway.delete_calls == before + 1


def test_stopping_the_gateway_closes_its_sockets_as_going_away() -> None:
    with LocalGateway(stage="other") as gateway:
        client = gateway.connect()
        assert gateway.ws_url.endswith("/other")

    assert client.wait_closed(timeout=5)
    assert client.close_code == 1001
