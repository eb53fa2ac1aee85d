"""A fault-injecting reverse proxy on loopback, between the worker's boto3 clients and moto or the WebSocket gateway.

Every request is named by service (the credential scope of its SigV4 ``Authorization`` header) and operation
(``X-Amz-Target`` for the JSON protocols; method, path and query for S3 and the REST APIs). A seeded ``FaultPlan``
then decides, at a per-service or per-operation rate, whether to forward it or to inject one fault:

* ``throttle``: 400 ``ThrottlingException`` (JSON services), 503 ``SlowDown`` (S3), 429 ``LimitExceededException``
  (the Management API);
* ``too-many``: 429 ``TooManyRequestsException``;
* ``server-error``: 500 ``InternalError``;
* ``reset``: the request is read and the socket closed with a TCP reset, no answer;
* ``delay``: the request IS carried out upstream, and its answer held past the client's read timeout;
* ``access-denied``: 400 ``AccessDeniedException`` (JSON services), 403 ``AccessDenied`` (S3): a permanent error, so
  not among the kinds a plan picks from unless it names it.
* ``bad-gateway``, ``null-body``, ``list-body``: a 502 whose JSON body is not an object (``"Bad Gateway"``, ``null``,
  ``[]``), as a load balancer in front of a service may answer; botocore's parser raises on it. Not picked by default.

``FaultPlan.latency`` slows chosen operations down without failing them (a slow dependency). ``FaultPlan.quotas``
enforces a request quota on chosen operations, as AWS does: a token bucket refilled at the quota's rate and holding
one second's worth; a request finding it empty is throttled (``throttle``), and ``achieved_rate`` says how many
requests a second it let through.

Faults are answered at the wire, so the worker's real botocore client, its retries and ours are what is exercised.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

KINDS = ("throttle", "too-many", "server-error", "reset", "delay")
"""The transient faults, the ones a plan picks from by default."""
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "upgrade", "expect", "content-length"}
)
GARBLED = {"bad-gateway": b'"Bad Gateway"', "null-body": b"null", "list-body": b"[]"}
"""The 502 answers whose body is JSON but not an object, by kind."""
JSON_THROTTLE = {"dynamodb": "ThrottlingException", "kms": "ThrottlingException", "sqs": "ThrottlingException"}


@dataclass(frozen=True)
class Call:
    """One request, as the proxy names it."""

    service: str
    operation: str


@dataclass
class FaultPlan:
    """Which requests fail and how: seeded, thread-safe, and counting what it did.

    Args:
        rate: the share of requests that get a fault, unless ``rates`` says otherwise.
        seed: the random generator's seed.
        rates: overrides by ``"service"`` or ``"service:Operation"`` (the more specific wins).
        kinds: the faults to choose from, uniformly.
        delay_seconds: how long a ``delay`` holds its answer (set it past the client's read timeout).
    """

    rate: float
    seed: int = 0
    rates: dict[str, float] = field(default_factory=dict)
    kinds: tuple[str, ...] = KINDS
    delay_seconds: float = 1.0
    latency: dict[str, float] = field(default_factory=dict)
    """Seconds added to every forwarded request of ``"service:Operation"`` (a slow dependency, not a fault)."""
    injected: Counter[str] = field(default_factory=Counter)
    """Faults injected, by kind."""
    by_call: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    """Faults injected, by (service, operation, kind)."""
    requests: Counter[Call] = field(default_factory=Counter)
    """Every request seen, faulted or not."""
    quotas: dict[str, float] = field(default_factory=dict)
    """Requests per second that ``"service:Operation"`` accepts; the rest are throttled, like an AWS request quota."""
    over_quota: Counter[str] = field(default_factory=Counter)
    """Requests throttled by a quota, by ``"service:Operation"``."""

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # tokens, and when they were counted
        self._within_quota: dict[str, list[float]] = {}
        self.enabled = True

    def rate_for(self, call: Call) -> float:
        for name in (f"{call.service}:{call.operation}", call.service):
            if name in self.rates:
                return self.rates[name]
        return self.rate

    def choose(self, call: Call) -> str | None:
        """The fault for this request, or None to forward it; counted."""
        with self._lock:
            self.requests[call] += 1
            if self.enabled and self._over_quota(f"{call.service}:{call.operation}"):
                return "throttle"
            if not self.enabled or self._random.random() >= self.rate_for(call):
                return None
            kind = self._random.choice(self.kinds)
            self.injected[kind] += 1
            self.by_call[(call.service, call.operation, kind)] += 1
            return kind

    def _over_quota(self, name: str) -> bool:
        """Whether a request of ``name`` finds its quota's bucket empty (the caller holds the lock)."""
        quota = self.quotas.get(name)
        if quota is None:
            return False
        now = time.monotonic()
        tokens, counted = self._buckets.get(name, (quota, now))
        tokens = min(quota, tokens + (now - counted) * quota)
        if tokens < 1.0:
            self._buckets[name] = (tokens, now)
            self.over_quota[name] += 1
            return True
        self._buckets[name] = (tokens - 1.0, now)
        self._within_quota.setdefault(name, []).append(now)
        return False

    def achieved_rate(self, name: str) -> float:
        """Requests of ``name`` let through by its quota, per second, from the first to the last."""
        with self._lock:
            times = self._within_quota.get(name, [])
        if len(times) < 2:
            return 0.0
        return (len(times) - 1) / (times[-1] - times[0])

    @property
    def total_injected(self) -> int:
        return sum(self.injected.values())

    def calls_of(self, service: str) -> dict[str, int]:
        """Requests seen for ``service``, by operation."""
        with self._lock:
            return {c.operation: n for c, n in self.requests.items() if c.service == service}


def name_call(method: str, target: str, headers: Any) -> Call:
    """Name a request: service from the SigV4 credential scope, operation from the target header or the REST shape."""
    service = "unknown"
    authorization = headers.get("Authorization", "")
    if "Credential=" in authorization:
        scope = authorization.split("Credential=", 1)[1].split(",", 1)[0].split("/")
        if len(scope) >= 4:
            service = scope[3]
    amz_target = headers.get("X-Amz-Target")
    if amz_target:
        return Call(service, amz_target.rsplit(".", 1)[-1])
    url = urlsplit(target)
    if service == "s3":
        return Call(service, _s3_operation(method, url.path, parse_qs(url.query, keep_blank_values=True)))
    if service == "execute-api":
        return Call(service, {"DELETE": "DeleteConnection", "GET": "GetConnection"}.get(method, "PostToConnection"))
    return Call(service, f"{method} {url.path}")


def _s3_operation(method: str, path: str, query: dict[str, list[str]]) -> str:
    by_query = {
        ("GET", "list-type"): "ListObjectsV2",
        ("GET", "versions"): "ListObjectVersions",
        ("GET", "versioning"): "GetBucketVersioning",
        ("PUT", "versioning"): "PutBucketVersioning",
        ("POST", "delete"): "DeleteObjects",
    }
    for (verb, name), operation in by_query.items():
        if method == verb and name in query:
            return operation
    has_key = "/" in path.strip("/")
    by_method = {"GET": "GetObject", "PUT": "PutObject", "DELETE": "DeleteObject", "HEAD": "HeadObject"}
    if has_key:
        return by_method.get(method, method)
    return {"GET": "ListObjects", "PUT": "CreateBucket", "DELETE": "DeleteBucket"}.get(method, method)


def fault_response(kind: str, call: Call) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of an injected error, in the service's own protocol."""
    if kind in GARBLED:
        return 502, {"Content-Type": "application/x-amz-json-1.0"}, GARBLED[kind]
    status, code = {
        "throttle": (400, "ThrottlingException"),
        "too-many": (429, "TooManyRequestsException"),
        "access-denied": (400, "AccessDeniedException"),
    }.get(kind, (500, "InternalError"))
    if call.service == "s3":
        if kind == "throttle":
            status, code = 503, "SlowDown"
        elif kind == "access-denied":
            status, code = 403, "AccessDenied"
        body = f"<Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
        return status, {"Content-Type": "application/xml"}, body
    if call.service == "execute-api" and kind == "throttle":
        status, code = 429, "LimitExceededException"
    if kind == "throttle":
        code = JSON_THROTTLE.get(call.service, code)
    body = json.dumps({"__type": code, "message": "injected"}).encode()
    return status, {"Content-Type": "application/x-amz-json-1.1", "x-amzn-ErrorType": code}, body


class FaultProxy:
    """A reverse proxy on 127.0.0.1 and a free port, forwarding to ``upstream`` under ``plan``."""

    def __init__(self, upstream: str, plan: FaultPlan) -> None:
        target = urlsplit(upstream)
        self.upstream = (target.hostname or "127.0.0.1", target.port or 80)
        self.plan = plan
        self._server = _Server(self)
        # A short poll interval: stopping the proxy waits for it (0.5 s by default, at every test's teardown).
        serve = lambda: self._server.serve_forever(poll_interval=0.05)  # noqa: E731
        self._thread = threading.Thread(target=serve, name="fault-proxy", daemon=True)

    @property
    def url(self) -> str:
        """The proxy's root; requests keep their path, so a gateway stage is reached at ``{url}/{stage}``."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def forward(self, method: str, target: str, headers: dict[str, str], body: bytes) -> tuple[int, list[Any], bytes]:
        """Send the request upstream as it came; the answer's status, headers and body."""
        connection = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            connection.request(
                method, target, body=body if body or method in ("POST", "PUT") else None, headers=headers
            )
            response = connection.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            connection.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, proxy: FaultProxy) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.proxy = proxy

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that reset or vanish (a killed worker) are part of the game, not errors to print."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as botocore's pool expects
    server: _Server

    def log_message(self, *args: Any) -> None:  # one line per request would drown the test output
        pass

    def finish(self) -> None:
        with contextlib.suppress(OSError):  # a reset or an abandoned (timed-out) connection
            super().finish()

    def _serve(self) -> None:
        proxy = self.server.proxy
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        call = name_call(self.command, self.path, self.headers)
        kind = proxy.plan.choose(call)
        if kind == "reset":
            self._reset()
        elif kind in (None, "delay"):
            time.sleep(proxy.plan.latency.get(f"{call.service}:{call.operation}", 0.0))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            status, upstream_headers, answer = proxy.forward(self.command, self.path, headers, body)
            if kind == "delay":
                time.sleep(proxy.plan.delay_seconds)
            self._answer(status, {k: v for k, v in upstream_headers if k.lower() not in HOP_BY_HOP}, answer)
        else:
            self._answer(*fault_response(kind, call))

    def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except OSError:  # the client gave up (a delay past its timeout)
            self.close_connection = True

    def _reset(self) -> None:
        self.close_connection = True
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _serve
