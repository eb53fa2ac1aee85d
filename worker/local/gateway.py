"""A local WebSocket gateway with API Gateway's semantics, for the demo and the tests.

moto accepts DeleteConnection for any id and never closes anything. This gateway holds real sockets on 127.0.0.1 and
serves the Management API the way API Gateway does, so boto3's ``apigatewaymanagementapi`` client pointed at
``callback_url`` behaves as in production: DeleteConnection closes the client's socket (204), GetConnection and
PostToConnection answer 200, and a connection that is unknown or already closed answers 410 ``GoneException``.

Clients connect to ``ws_url`` and receive ``{"connectionId": "..."}`` first (a real API would send it from its
``$connect`` route). Tests can make the next management calls fail (``fail_next``) and observe the sockets.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import string
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
from aiohttp import web

from worker.local.gateway_client import GatewayClient as GatewayClient
from worker.local.gateway_client import LoopThread

MAX_POST_BYTES = 128 * 1024  # API Gateway's WebSocket frame limit
ERROR_TYPES = {
    403: "ForbiddenException",
    410: "GoneException",
    413: "PayloadTooLargeException",
    429: "LimitExceededException",
    500: "InternalServerErrorException",
}
_ID_ALPHABET = string.ascii_letters + string.digits


def new_connection_id() -> str:
    """An id shaped like API Gateway's: 16 characters of base64 ending in ``=``, URL-safe without quoting."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(15)) + "="


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class _Connection:
    ws: web.WebSocketResponse
    source_ip: str
    user_agent: str
    connected_at: str = field(default_factory=_now)
    last_active_at: str = field(default_factory=_now)
    gone: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class _Fault:
    status: int
    error_type: str | None
    message: str


class LocalGateway:
    """WebSocket endpoint plus the ``@connections`` Management API of one stage, on 127.0.0.1 and a free port."""

    def __init__(self, stage: str = "local") -> None:
        self.stage = stage
        self.port = 0
        self.calls: Counter[str] = Counter()
        """Management calls received, by HTTP method (injected failures included)."""
        self._lock = threading.Lock()
        self._connections: dict[str, _Connection] = {}
        self._faults: list[_Fault] = []
        self._server: LoopThread | None = None
        self._clients: LoopThread | None = None
        self._runner: web.AppRunner | None = None
        self._open_clients: list[GatewayClient] = []

    # Lifecycle.
    def start(self) -> LocalGateway:
        self._server = LoopThread("local-gateway")
        self._server.run(self._serve())
        return self

    def stop(self) -> None:
        """Close every socket from the server side (1001 going away), then stop the server and the clients."""
        if self._server is not None:
            self._server.run(self._shutdown())
            self._server.close()
            self._server = None
        for client in self._open_clients:
            client.close()
        self._open_clients.clear()
        if self._clients is not None:
            self._clients.close()
            self._clients = None

    def __enter__(self) -> LocalGateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/{self.stage}"

    @property
    def callback_url(self) -> str:
        """The Management API endpoint: boto3 calls ``{callback_url}/@connections/{id}``."""
        return f"http://127.0.0.1:{self.port}/{self.stage}"

    # Test hooks and observations.
    def fail_next(self, n: int, *, status: int = 500, error_type: str | None = None, message: str = "") -> None:
        """Answer the next ``n`` management calls with ``status`` (and ``x-amzn-ErrorType``) instead of serving them."""
        fault = _Fault(status, error_type or ERROR_TYPES.get(status), message or f"injected {status}")
        with self._lock:
            self._faults.extend([fault] * n)

    def is_open(self, connection_id: str) -> bool:
        with self._lock:
            connection = self._connections.get(connection_id)
        return connection is not None and not connection.ws.closed

    def connection_ids(self) -> set[str]:
        with self._lock:
            return {cid for cid, connection in self._connections.items() if not connection.ws.closed}

    def wait_gone(self, connection_id: str, timeout: float = 5.0) -> bool:
        """Wait until the gateway has dropped ``connection_id`` (closed by either side); False on timeout."""
        with self._lock:
            connection = self._connections.get(connection_id)
        return connection is None or connection.gone.wait(timeout)

    @property
    def delete_calls(self) -> int:
        return self.calls["DELETE"]

    def connect(self, timeout: float = 5.0) -> GatewayClient:
        """Open a real WebSocket client to this gateway and wait for its connection id."""
        if self._clients is None:
            self._clients = LoopThread("local-gateway-clients")
        client = self._clients.run(GatewayClient.open(self._clients, self.ws_url, timeout), timeout + 1)
        self._open_clients.append(client)
        return client

    # Server.
    async def _serve(self) -> None:
        app = web.Application(client_max_size=MAX_POST_BYTES * 2)
        app.router.add_get(f"/{self.stage}", self._on_connect)
        app.router.add_route("*", f"/{self.stage}/@connections/{{connection_id}}", self._on_management)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.Server)
        self.port = server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        with self._lock:
            connections = list(self._connections.values())
        for connection in connections:
            await connection.ws.close(code=aiohttp.WSCloseCode.GOING_AWAY)
        if self._runner is not None:
            await self._runner.cleanup()

    async def _on_connect(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        connection_id = new_connection_id()
        connection = _Connection(ws, request.remote or "", request.headers.get("User-Agent", ""))
        with self._lock:
            self._connections[connection_id] = connection
        try:
            await ws.send_json({"connectionId": connection_id})
            async for _ in ws:
                connection.last_active_at = _now()
        finally:
            with self._lock:
                self._connections.pop(connection_id, None)
            connection.gone.set()
        return ws

    async def _on_management(self, request: web.Request) -> web.Response:
        self.calls[request.method] += 1
        with self._lock:
            fault = self._faults.pop(0) if self._faults else None
            connection = self._connections.get(request.match_info["connection_id"])
        if fault is not None:
            return _error(fault.status, fault.error_type, fault.message)
        if connection is None or connection.ws.closed:
            return _error(410, "GoneException", None)
        if request.method == "GET":
            return _json(200, connection_info(connection))
        if request.method == "POST":
            return await _post(connection, await request.read())
        if request.method == "DELETE":
            await connection.ws.close(code=aiohttp.WSCloseCode.OK, message=b"deleted")
            return web.Response(status=204, headers=_request_id())
        return _error(405, "MethodNotAllowedException", f"{request.method} not allowed")


def connection_info(connection: _Connection) -> dict[str, Any]:
    """The GetConnection answer."""
    return {
        "connectedAt": connection.connected_at,
        "identity": {"sourceIp": connection.source_ip, "userAgent": connection.user_agent},
        "lastActiveAt": connection.last_active_at,
    }


async def _post(connection: _Connection, data: bytes) -> web.Response:
    if len(data) > MAX_POST_BYTES:
        return _error(413, "PayloadTooLargeException", "Message too long")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        await connection.ws.send_bytes(data)
    else:
        await connection.ws.send_str(text)
    connection.last_active_at = _now()
    return web.Response(status=200, headers=_request_id())


def _request_id() -> dict[str, str]:
    return {"x-amzn-RequestId": str(uuid.uuid4())}


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps(body),
        content_type="application/json",
        headers={**_request_id(), **(headers or {})},
    )


def _error(status: int, error_type: str | None, message: str | None) -> web.Response:
    # botocore's rest-json parser takes the error code from x-amzn-ErrorType; API Gateway's GoneException body is
    # {"message": null}.
    return _json(status, {"message": message}, {"x-amzn-ErrorType": error_type} if error_type else None)
