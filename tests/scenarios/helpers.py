"""The world a scenario runs in, and the exact check of its final state.

A ``World`` is a session stack in moto, the local WebSocket gateway, and a fault proxy in front of each; the worker's
runtime reaches both only through the proxies. Sessions are made with their grant token kept (the security tests look
for it in the logs), and ``assert_final_state`` compares the whole bucket, the key's grants and the sockets with what
must remain.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest

from cleanup import deadline
from cleanup.aws.clients import Clients
from cleanup.runtime import Runtime
from cleanup.telemetry import Metrics, MetricsSink
from schemas.settings import Settings
from tests.proxy import FaultPlan, FaultProxy
from tests.stack import SessionStack
from worker import lambda_handler
from worker.local.backend import LocalAws
from worker.local.gateway import GatewayClient, LocalGateway

HTTP_TIMEOUT = 0.5
SENTINELS = ("sessions/keep", "sessions/t1", "sessions/t1x/c", "other/t1/x/a", "sessions/t2/live/a", "sessionsX/t1/a")


class ProxiedClients(Clients):
    """Every client of the runtime goes to ``endpoint_url``; each operation called is counted (botocore before-call)."""

    def __init__(self, settings: Settings, endpoint_url: str) -> None:
        super().__init__(settings)
        self.endpoint_url = endpoint_url
        self.operations: Counter[tuple[str, str]] = Counter()
        self._count_lock = threading.Lock()

    def _create(self, service: str, endpoint_url: str | None, region: str | None = None) -> Any:
        client = super()._create(service, endpoint_url or self.endpoint_url, region)
        client.meta.events.register("before-call", self._count)
        return client

    def _count(self, model: Any, **_: Any) -> None:
        with self._count_lock:
            self.operations[(model.service_model.service_name, model.name)] += 1


class CountingSink(MetricsSink):
    """Keeps the totals of every metric flushed, by name (values summed, dimensions folded)."""

    def __init__(self) -> None:
        super().__init__("off")
        self.totals: Counter[str] = Counter()

    def write(self, documents: Iterable[dict[str, Any]]) -> None:
        for document in documents:
            name = document["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Name"]
            value = document[name]
            self.totals[name] += int(value) if not isinstance(value, list) else len(value)


@dataclass(frozen=True)
class Made:
    """A session made for a scenario: its id, scratch objects, grant (and token) and socket."""

    id: str
    prefix: str
    objects: tuple[str, ...]
    grant_id: str
    grant_token: str
    socket: GatewayClient | None = None


@dataclass
class World:
    stack: SessionStack
    gateway: LocalGateway
    plan: FaultPlan
    aws_proxy: FaultProxy
    gateway_proxy: FaultProxy
    sink: CountingSink = field(default_factory=CountingSink)
    runtimes: list[Runtime] = field(default_factory=list)
    _table_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def settings(self, **overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "ws_callback_url": f"{self.gateway_proxy.url}/{self.gateway.stage}",
            "botocore_max_attempts": 1,  # our retries, not botocore's 0.5 s-based backoff, meet the faults
            "http_timeout_seconds": HTTP_TIMEOUT,
            "bulk_timeout_seconds": HTTP_TIMEOUT,  # so that a delayed answer times out, listings and deletes included
            "retry_attempts": 4,
            "retry_max_wait_seconds": 0.05,
            **overrides,
        }
        return self.stack.settings(**values)

    def runtime(self, **overrides: Any) -> Runtime:
        settings = self.settings(**overrides)
        runtime = Runtime(settings, ProxiedClients(settings, self.aws_proxy.url), Metrics(settings, self.sink))
        self.runtimes.append(runtime)
        return runtime

    def invoker(self, runtime: Runtime) -> Callable[[dict[str, Any]], dict[str, Any]]:
        """Invoke the Lambda handler, warm with ``runtime``."""

        def invoke(event: dict[str, Any]) -> dict[str, Any]:
            with lambda_handler.warm.use(runtime):
                return lambda_handler.handler(event, None)

        return invoke

    def make_sessions(self, ids: list[str], *, sockets: int = 0, objects: int = 1, **extra: Any) -> list[Made]:
        """Create sessions (the first ``sockets`` with a real socket) concurrently; returns them in order."""
        clients = [self.gateway.connect() for _ in range(sockets)]
        with ThreadPoolExecutor(8) as pool:
            futures = [
                pool.submit(self._make, sid, clients[i] if i < sockets else None, objects, extra)
                for i, sid in enumerate(ids)
            ]
            return [future.result() for future in futures]

    def _make(self, sid: str, socket: GatewayClient | None, objects: int, extra: dict[str, Any]) -> Made:
        stack = self.stack
        prefix = f"sessions/t1/{sid}/"
        keys = tuple(f"{prefix}part-{n}" for n in range(objects))
        for key in keys:
            stack.s3.put_object(Bucket=stack.bucket, Key=key, Body=b"scratch")
        grant = stack.kms.create_grant(
            KeyId=stack.key_arn,
            GranteePrincipal="arn:aws:iam::123456789012:role/agent",
            Operations=["Decrypt"],
            Name=f"session:{sid}",  # bound to its session (SESSION_BINDING)
        )
        item: dict[str, Any] = {
            "pk": f"session#{sid}",
            "sk": "meta",
            "tenantId": "t1",
            "scratchPrefix": prefix,
            "grantId": grant["GrantId"],
            "ttl": 1_000,
            **extra,
        }
        if socket is not None:
            item["connectionId"] = socket.connection_id
        self._write(stack.put_item, item)
        return Made(sid, prefix, keys, grant["GrantId"], grant["GrantToken"], socket)

    def end(self, sessions: list[Made], *, ttl_share: int = 2) -> None:
        """Delete the sessions' items: every ``ttl_share``-th by TTL, the others explicitly."""
        for index, made in enumerate(sessions):  # one at a time: see ``_write``
            if index % ttl_share == 0:
                self.stack.expire(made.id)
            else:
                self._write(self.stack.delete, made.id)

    def _write(self, write: Callable[[Any], None], argument: Any) -> None:
        # moto numbers a stream record from the shard's length without a lock: concurrent writes to one table can
        # share a sequence number, which real DynamoDB never does. Writes to the table go one at a time.
        with self._table_lock:
            write(argument)

    def plant_sentinels(self) -> set[str]:
        """Objects outside every session prefix (near misses included); they must all survive."""
        for key in SENTINELS:
            self.stack.s3.put_object(Bucket=self.stack.bucket, Key=key, Body=b"keep")
        return set(SENTINELS)

    def records(self) -> list[dict[str, Any]]:
        """The stream's new records, as the Lambda event source mapping delivers them."""
        return list(self.stack.lambda_event()["Records"])


def assert_final_state(world: World, *, deleted: list[Made], live: list[Made], kept: Iterable[str] = ()) -> None:
    """Exactly the live sessions' objects and the ``kept`` keys remain; exactly their grants; only their sockets."""
    stack = world.stack
    expected_objects = {key for made in live for key in made.objects} | set(kept)
    objects = set(stack.objects())
    assert objects == expected_objects, (
        f"left: {sorted(objects - expected_objects)[:5]}, lost: {sorted(expected_objects - objects)[:5]}"
    )
    grants = stack.grant_ids()
    expected_grants = {made.grant_id for made in live}
    assert grants == expected_grants, f"left: {len(grants - expected_grants)}, lost: {len(expected_grants - grants)}"
    for made in deleted:
        if made.socket is not None:
            assert made.socket.wait_closed(5.0), f"socket of {made.id} still open"
    for made in live:
        if made.socket is not None:
            assert not made.socket.closed and world.gateway.is_open(made.socket.connection_id)


LOADED_MARGINS = (8.0, 1.0)
"""The margins a test on a loaded machine keeps after its deadline (for reporting, and of that for answering): the
worker's own (``cleanup.deadline``: 2 s and 0.5 s) are sized for a Lambda function's CPU, not for a shared test
machine running two suites at once, whose reporting calls may take seconds."""


def loaded_machine_margins(monkeypatch: pytest.MonkeyPatch) -> float:
    """Give the deadline the margins of ``LOADED_MARGINS`` for the test; returns the reporting margin."""
    safety, answer = LOADED_MARGINS
    monkeypatch.setattr(deadline, "SAFETY_MARGIN_SECONDS", safety)
    monkeypatch.setattr(deadline, "ANSWER_MARGIN_SECONDS", answer)
    return safety


class LambdaContext:
    """An invocation's context: ``get_remaining_time_in_millis`` counts down from ``seconds`` in real time."""

    def __init__(self, seconds: float) -> None:
        self.ends_at = time.monotonic() + seconds

    def get_remaining_time_in_millis(self) -> int:
        return int((self.ends_at - time.monotonic()) * 1000)


@dataclass
class Delivery:
    """What delivering a stream took: invocations, records delivered again, failures reported."""

    invocations: int = 0
    redelivered: int = 0
    reported: int = 0


def sequence_number(record: dict[str, Any]) -> str:
    return str(record["dynamodb"]["SequenceNumber"])


def deliver_like_lambda(
    records: list[dict[str, Any]],
    invoke: Callable[[dict[str, Any]], dict[str, Any]],
    *,
    batch_size: int = 100,
    max_invocations: int = 400,
    delivery: Delivery | None = None,
) -> Delivery:
    """Deliver ``records`` as an event source mapping with ReportBatchItemFailures does, until all are through.

    After a partial failure Lambda resumes from the lowest reported sequence number: every record from it on is
    delivered again, successes included.
    """
    delivery = delivery or Delivery()
    position = 0
    while position < len(records):
        assert delivery.invocations < max_invocations, f"stuck at record {position} of {len(records)}"
        batch = records[position : position + batch_size]
        response = invoke({"Records": batch})
        delivery.invocations += 1
        failed = {failure["itemIdentifier"] for failure in response["batchItemFailures"]}
        numbers = [sequence_number(record) for record in batch]
        assert failed <= set(numbers), "a reported itemIdentifier is not in the batch: Lambda would retry it all"
        if not failed:
            position += len(batch)
            continue
        delivery.reported += len(failed)
        first = numbers.index(min(failed, key=int))
        delivery.redelivered += len(batch) - first
        position += first
    return delivery


def new_ids(count: int, tag: str) -> list[str]:
    run = uuid.uuid4().hex[:6]
    return [f"{tag}-{run}-{n:04d}" for n in range(count)]


@pytest.fixture
def world(stack: SessionStack, gateway: LocalGateway, aws: LocalAws) -> Iterator[World]:
    """A stack and the gateway behind fault proxies sharing one plan (no faults until a test sets a rate)."""
    plan = FaultPlan(rate=0.0, seed=20240601, delay_seconds=HTTP_TIMEOUT + 0.3)
    with FaultProxy(aws.endpoint_url, plan) as aws_proxy, FaultProxy(gateway.callback_url, plan) as gateway_proxy:
        built = World(stack, gateway, plan, aws_proxy, gateway_proxy)
        yield built
        plan.enabled = False
        for runtime in built.runtimes:
            runtime.close()
