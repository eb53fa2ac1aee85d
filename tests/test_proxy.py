"""The fault proxy itself: it forwards faithfully, names calls right, and injects each fault as a client sees it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionClosedError, ReadTimeoutError

from tests.proxy import Call, FaultPlan, FaultProxy
from tests.stack import REGION, SessionStack, harness_session
from worker.local.gateway import LocalGateway

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def plan() -> FaultPlan:
    return FaultPlan(rate=0.0, seed=1, delay_seconds=0.6)


@pytest.fixture
def proxy(aws: Any, plan: FaultPlan) -> Iterator[FaultProxy]:
    with FaultProxy(aws.endpoint_url, plan) as running:
        yield running


def proxied(service: str, url: str, read_timeout: float = 10.0, **config: Any) -> Any:
    """One attempt per call, so each answer is the proxy's own; a short read bound only where a delay is the point."""
    settings = Config(retries={"total_max_attempts": 1}, read_timeout=read_timeout, connect_timeout=2, **config)
    return harness_session().client(service, region_name=REGION, endpoint_url=url, config=settings)


def test_without_faults_every_call_is_forwarded_and_named(stack: SessionStack, proxy: FaultProxy, plan) -> None:
    s3 = proxied("s3", proxy.url)
    s3.put_object(Bucket=stack.bucket, Key="sessions/t/a/x", Body=b"1")
    listed = s3.list_objects_v2(Bucket=stack.bucket, Prefix="sessions/")
    proxied("kms", proxy.url).list_grants(KeyId=stack.key_arn)
    proxied("dynamodb", proxy.url).get_item(TableName=stack.table, Key=stack.key("none"))

    assert [o["Key"] for o in listed["Contents"]] == ["sessions/t/a/x"]
    assert plan.requests == {
        Call("s3", "PutObject"): 1,
        Call("s3", "ListObjectsV2"): 1,
        Call("kms", "ListGrants"): 1,
        Call("dynamodb", "GetItem"): 1,
    }
    assert plan.total_injected == 0


@pytest.mark.parametrize(
    ("service", "code", "status"),
    [("dynamodb", "ThrottlingException", 400), ("kms", "ThrottlingException", 400), ("s3", "SlowDown", 503)],
)
def test_throttling_is_answered_in_the_services_own_protocol(stack, proxy, plan, service, code, status) -> None:
    plan.rate, plan.kinds = 1.0, ("throttle",)
    calls = {
        "dynamodb": lambda c: c.get_item(TableName=stack.table, Key=stack.key("x")),
        "kms": lambda c: c.list_grants(KeyId=stack.key_arn),
        "s3": lambda c: c.list_objects_v2(Bucket=stack.bucket),
    }

    with pytest.raises(ClientError) as raised:
        calls[service](proxied(service, proxy.url))

    assert raised.value.response["Error"]["Code"] == code
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == status
    assert plan.injected == {"throttle": 1}


@pytest.mark.parametrize(
    ("service", "code", "status"), [("dynamodb", "AccessDeniedException", 400), ("s3", "AccessDenied", 403)]
)
def test_access_denied_is_answered_in_the_services_own_protocol(stack, proxy, plan, service, code, status) -> None:
    plan.rate, plan.kinds = 1.0, ("access-denied",)
    calls = {
        "dynamodb": lambda c: c.get_item(TableName=stack.table, Key=stack.key("x")),
        "s3": lambda c: c.list_objects_v2(Bucket=stack.bucket),
    }

    with pytest.raises(ClientError) as raised:
        calls[service](proxied(service, proxy.url))

    assert raised.value.response["Error"]["Code"] == code
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == status
    assert plan.injected == {"access-denied": 1}


def test_a_reset_reaches_the_client_as_a_closed_connection(stack, proxy, plan) -> None:
    plan.rate, plan.kinds = 1.0, ("reset",)

    with pytest.raises(ConnectionClosedError):
        proxied("kms", proxy.url).list_grants(KeyId=stack.key_arn)


def test_a_delayed_call_times_out_at_the_client_but_is_carried_out(stack, proxy, plan) -> None:
    plan.rate, plan.kinds, plan.delay_seconds = 1.0, ("delay",), 3.0
    grant = stack.kms.create_grant(
        KeyId=stack.key_arn, GranteePrincipal="arn:aws:iam::123456789012:role/a", Operations=["Decrypt"]
    )["GrantId"]

    with pytest.raises(ReadTimeoutError):  # the answer is held 3 s past the forward: the client gives up at 1 s
        proxied("kms", proxy.url, read_timeout=1.0).retire_grant(KeyId=stack.key_arn, GrantId=grant)

    # under load the forward itself may outlast the client's read timeout: wait (bounded) for what KMS then holds
    deadline = time.monotonic() + 60
    while grant in stack.grant_ids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert grant not in stack.grant_ids()


def test_rates_apply_per_operation(stack, proxy, plan) -> None:
    plan.rates = {"s3:ListObjectsV2": 1.0}
    s3 = proxied("s3", proxy.url)

    s3.put_object(Bucket=stack.bucket, Key="sessions/t/b/x", Body=b"1")
    with pytest.raises(ClientError):
        s3.list_objects_v2(Bucket=stack.bucket)

    assert {(service, operation) for service, operation, _ in plan.by_call} == {("s3", "ListObjectsV2")}
    assert plan.total_injected == 1


def test_the_management_api_of_the_gateway_is_proxied_too(gateway: LocalGateway, plan) -> None:
    socket = gateway.connect()
    with FaultProxy(gateway.callback_url, plan) as proxy:
        plan.rate, plan.kinds = 1.0, ("throttle",)
        api = proxied("apigatewaymanagementapi", f"{proxy.url}/{gateway.stage}")
        with pytest.raises(ClientError) as raised:
            api.delete_connection(ConnectionId=socket.connection_id)
        plan.rate = 0.0
        api.delete_connection(ConnectionId=socket.connection_id)

    assert raised.value.response["Error"]["Code"] == "LimitExceededException"
    assert socket.wait_closed()
    assert plan.requests == {Call("execute-api", "DeleteConnection"): 2}


def test_a_quota_lets_its_rate_through_and_throttles_the_rest(stack: SessionStack, proxy: FaultProxy, plan) -> None:
    plan.quotas = {"kms:ListGrants": 5.0}
    kms = proxied("kms", proxy.url)
    answers = []
    started = time.monotonic()
    for _ in range(12):  # faster than 5 a second: the bucket's one second of 5, then throttling
        try:
            kms.list_grants(KeyId=stack.key_arn)
            answers.append("ok")
        except ClientError as exc:
            answers.append(exc.response["Error"]["Code"])
    refilled = 5.0 * (time.monotonic() - started)  # the tokens the bucket gained meanwhile

    assert 5 <= answers.count("ok") <= 5 + refilled
    assert set(answers) == {"ok", "ThrottlingException"}
    assert plan.over_quota["kms:ListGrants"] == answers.count("ThrottlingException")
    assert plan.requests[Call("kms", "ListGrants")] == 12
