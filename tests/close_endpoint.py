"""A close endpoint that answers as a test scripts it, over a real socket on 127.0.0.1: a status, a redirect, an answer
trickled a byte at a time, a garbled status line; it keeps every request it received."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

Answer = Callable[["Endpoint", socket.socket], None]
TRICKLE_SECONDS = 40.0  # far past any close's deadline: a call bounded by the wall clock hangs up long before


@dataclass
class Endpoint:
    """The endpoint's script (``answer``) and what it saw: each request's method, target and headers, and whether a
    client hung up before a trickled answer was complete."""

    port: int = 0
    answer: Answer = field(default=lambda endpoint, sock: status(410)(endpoint, sock))
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    hung_up: threading.Event = field(default_factory=threading.Event)

    def url(self, path: str = "/@connections/{connectionId}") -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def status(code: int, headers: dict[str, str] | None = None, body: bytes = b"") -> Answer:
    def answer(endpoint: Endpoint, sock: socket.socket) -> None:
        lines = [f"HTTP/1.1 {code} Scripted", f"Content-Length: {len(body)}", "Connection: close"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)

    return answer


def garbled(endpoint: Endpoint, sock: socket.socket) -> None:
    sock.sendall(b"HTTP/1.1 2OO OK\r\n\r\n")


def trickled(endpoint: Endpoint, sock: socket.socket) -> None:
    """A 200 whose header comes a byte every 0.2 s, for far longer than any close may take."""
    try:
        sock.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        until = time.monotonic() + TRICKLE_SECONDS
        while time.monotonic() < until:
            sock.sendall(b"a")
            time.sleep(0.2)
        sock.sendall(b"\r\nContent-Length: 0\r\n\r\n")
    except OSError:  # the client hung up
        endpoint.hung_up.set()


@contextmanager
def running() -> Iterator[Endpoint]:
    endpoint = Endpoint()

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            line = self.rfile.readline().decode("latin-1").split()
            headers = {}
            while (header := self.rfile.readline().decode("latin-1").strip()) != "":
                name, _, value = header.partition(":")
                headers[name.strip()] = value.strip()
            endpoint.requests.append((line[0], line[1], headers))
            endpoint.answer(endpoint, self.connection)

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    endpoint.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield endpoint
    finally:
        server.shutdown()
        server.server_close()
