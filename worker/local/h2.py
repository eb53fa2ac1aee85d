"""moto served over HTTP/2 without TLS (h2c), for clients that insist on HTTP/2, such as the KCL's Kinesis client.

moto's own server speaks only HTTP/1.1. hypercorn serves moto's WSGI app and accepts both HTTP/2 with prior knowledge
and HTTP/1.1 on the same plain TCP port, so boto3 keeps working against it. moto keeps its state in this process, so
an h2c server started next to a ``LocalAws`` serves the same tables, streams and buckets.
"""

from __future__ import annotations

import asyncio
import socket
import threading

STARTUP_TIMEOUT_SECONDS = 10.0


class H2cMoto:
    """moto on 127.0.0.1 over h2c and HTTP/1.1, in a background thread. Use as a context manager."""

    def __init__(self) -> None:
        self.endpoint_url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    def start(self) -> H2cMoto:
        port = _free_port()
        self.endpoint_url = f"http://127.0.0.1:{port}"
        self._thread = threading.Thread(target=self._serve, args=(port,), name="moto-h2c", daemon=True)
        self._thread.start()
        if not self._ready.wait(STARTUP_TIMEOUT_SECONDS):
            raise RuntimeError("the h2c moto server did not start")
        _wait_for_port(port)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(STARTUP_TIMEOUT_SECONDS)

    def __enter__(self) -> H2cMoto:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _serve(self, port: int) -> None:
        from hypercorn.asyncio import serve
        from hypercorn.config import Config
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

        config = Config()
        config.bind = [f"127.0.0.1:{port}"]
        config.accesslog = None
        config.errorlog = None
        app = DomainDispatcherApplication(create_backend_app)
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._ready.set()
        self._loop.run_until_complete(serve(app, config, mode="wsgi", shutdown_trigger=self._stop.wait))
        self._loop.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_for_port(port: int) -> None:
    for _ in range(200):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            threading.Event().wait(0.05)
    raise RuntimeError(f"the h2c moto server is not listening on port {port}")
