"""The client side of the local gateway (``worker.local.gateway``): a real WebSocket client, driven synchronously,
and the event loop in a thread of its own that both sides run on.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import aiohttp

T = TypeVar("T")


class LoopThread:
    """An asyncio event loop running in a daemon thread, driven from synchronous code."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class GatewayClient:
    """A real WebSocket client of the gateway (aiohttp over TCP), driven synchronously; a background task reads."""

    def __init__(self, loop: LoopThread, session: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.connection_id = ""
        self.messages: queue.Queue[str | bytes] = queue.Queue()
        self.close_code: int | None = None
        self._loop = loop
        self._session = session
        self._ws = ws
        self._closed = threading.Event()
        self._reader: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, loop: LoopThread, url: str, timeout: float) -> GatewayClient:
        session = aiohttp.ClientSession()
        try:
            ws = await session.ws_connect(url, timeout=aiohttp.ClientWSTimeout(ws_close=timeout))
            hello = await ws.receive_json(timeout=timeout)
        except BaseException:
            await session.close()
            raise
        client = cls(loop, session, ws)
        client.connection_id = str(hello["connectionId"])
        client._reader = asyncio.get_running_loop().create_task(client._read())
        return client

    async def _read(self) -> None:
        async for message in self._ws:
            if message.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                self.messages.put(message.data)
        self.close_code = self._ws.close_code
        await self._session.close()
        self._closed.set()

    @property
    def closed(self) -> bool:
        """True once the socket is closed (by the server, or by ``close()``)."""
        return self._closed.is_set()

    def wait_closed(self, timeout: float = 5.0) -> bool:
        """Wait for the socket to close; False if it is still open after ``timeout`` seconds."""
        return self._closed.wait(timeout)

    def receive(self, timeout: float = 5.0) -> str | bytes:
        """The next message the gateway delivered (``queue.Empty`` after ``timeout``)."""
        return self.messages.get(timeout=timeout)

    def close(self) -> None:
        """Close from the client side, as a browser leaving would."""
        if not self.closed:
            self._loop.run(self._ws.close())
            self._closed.wait(5.0)
