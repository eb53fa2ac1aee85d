"""Callback endpoints named by items: the configured APIs and stages only, signed for their own region, and a dead host
is permanent."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse

from cleanup.aws.clients import MANAGEMENT_CLIENTS, Clients
from cleanup.core.guard import callback_endpoint, execute_api_region
from cleanup.exceptions import RefusedEndpointError
from cleanup.queues.reporting import run_batch
from schemas.outcomes import ActionStatus, Status
from schemas.records import read_lambda_event
from schemas.settings import Settings
from tests.faults import RawBody
from tests.stack import SessionStack

LONDON = "https://abcdef1234.execute-api.eu-west-2.amazonaws.com/prod"


@pytest.mark.parametrize(
    "item_url",
    [
        "https://abcdef1234.execute-api.mars-east-1.amazonaws.com/prod",  # no such region
        "https://abcdef1234.execute-api.cn-north-1.amazonaws.com/prod",  # a China region under the global domain
        "https://abcdef1234.execute-api.eu-west-2.amazonaws.com.cn/prod",  # and the other way round
        "https://abcdef1234.execute-api.aws-global.amazonaws.com/prod",  # a pseudo-region
        "https://abcdef1234.execute-api.eu-west-2.example.com/prod",
    ],
)
def test_an_execute_api_host_outside_the_configured_ones_is_refused(item_url: str) -> None:
    with pytest.raises(RefusedEndpointError, match="ALLOWED_CALLBACK_URLS"):
        callback_endpoint(item_url, Settings(ws_callback_url=LONDON))


@pytest.mark.parametrize(
    ("url", "region"),
    [
        (LONDON, "eu-west-2"),
        ("https://abcdef1234.execute-api.cn-north-1.amazonaws.com.cn/prod", "cn-north-1"),
        ("https://abcdef1234.execute-api.us-gov-west-1.amazonaws.com/prod", "us-gov-west-1"),
        ("https://ws.example.com/prod", None),
    ],
)
def test_an_execute_api_endpoint_names_the_region_to_sign_for(url: str, region: str | None) -> None:
    assert execute_api_region(url) == region


class SentTo:
    """Answers a client's DeleteConnection at ``before-send`` (no network), keeping the signed request."""

    def __init__(self, client: Any) -> None:
        self.requests: list[Any] = []
        client.meta.events.register("before-send.apigatewaymanagementapi.DeleteConnection", self._answer)

    def _answer(self, request: Any, **_: Any) -> AWSResponse:
        self.requests.append(request)
        return AWSResponse(request.url, 204, {}, RawBody(b""))


def delete_session_with_callback(stack: SessionStack, callback_url: str) -> dict[str, Any]:
    item = stack.put_session("s", connection_id="Abc123def456ghi=", extra={"callbackUrl": callback_url})
    stack.delete("s")
    return item


def test_a_cross_region_endpoint_is_called_with_a_request_signed_for_its_region(stack: SessionStack) -> None:
    delete_session_with_callback(stack, LONDON)
    runtime = stack.runtime(allowed_callback_urls=LONDON)  # the worker itself is in us-east-1
    sent = SentTo(runtime.clients.management(LONDON, "eu-west-2"))

    outcome = run_batch(read_lambda_event(stack.lambda_event()), runtime)[-1]

    assert outcome.status is Status.CLEANED
    [request] = sent.requests
    assert request.url == f"{LONDON}/@connections/Abc123def456ghi%3D"
    assert "/eu-west-2/execute-api/aws4_request" in request.headers["Authorization"].decode()


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """getaddrinfo answering the given error for the given hosts (the others resolve as usual): no DNS is asked."""
    failing: dict[str, int] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host in failing:
            raise socket.gaierror(failing[host], "injected resolver answer")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return failing


def test_a_host_that_does_not_resolve_is_a_permanent_failure_of_the_connection_action(
    stack: SessionStack, resolver: dict[str, int]
) -> None:
    resolver["abcdef1234.execute-api.eu-west-2.amazonaws.com"] = socket.EAI_NONAME
    item = delete_session_with_callback(stack, LONDON)

    outcome = run_batch(read_lambda_event(stack.lambda_event()), stack.runtime(allowed_callback_urls=LONDON))[-1]

    actions = {a.action: a for a in outcome.actions}
    assert outcome.status is Status.FAILED and outcome.permanent
    assert actions["connection"].permanent and "does not resolve" in (actions["connection"].error or "")
    assert actions["grant"].status is ActionStatus.DONE and item["grantId"] not in stack.grant_ids()
    assert stack.objects(item["scratchPrefix"]) == []


def test_a_resolver_that_cannot_answer_now_is_transient(stack: SessionStack, resolver: dict[str, int]) -> None:
    resolver["abcdef1234.execute-api.eu-west-2.amazonaws.com"] = socket.EAI_AGAIN
    delete_session_with_callback(stack, LONDON)

    outcome = run_batch(
        read_lambda_event(stack.lambda_event()), stack.runtime(allowed_callback_urls=LONDON, retry_attempts=2)
    )[-1]

    assert outcome.status is Status.FAILED and not outcome.permanent


def test_the_management_clients_are_a_bounded_cache_of_the_most_recent_endpoints() -> None:
    clients = Clients(Settings())
    urls = [f"https://ws{n}.example.com/prod" for n in range(MANAGEMENT_CLIENTS * 3)]
    first = clients.management(urls[0])
    made = {url: clients.management(url) for url in urls[1:]}

    recent = urls[-MANAGEMENT_CLIENTS:]
    assert all(clients.management(url) is made[url] for url in recent)  # still cached, in use order
    assert clients.management(urls[0]) is not first  # the least recently used were dropped
