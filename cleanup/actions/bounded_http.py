"""One HTTP/1.1 exchange bounded by the wall clock: ``http-close``'s call to the application's own gateway.

A socket timeout bounds only the wait for each read: an answer trickled a byte at a time would hold a call far past
any deadline (22 s against a 4 s one). Here connecting, the TLS handshake, sending, the answer's status line and
headers and the first bytes of its body together end by one deadline, whatever the other end does: each read waits
at most for what is left of it. Nothing is followed: a redirect is an answer like any other, for the caller to judge.
"""

from __future__ import annotations

import http.client
import io
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

BODY_BYTES = 200  # of an answer's body, kept to name a failure
CONNECT_SECONDS = 2.0  # the most a connection may take of the exchange's time


@dataclass(frozen=True, slots=True)
class Answer:
    """What the other end answered: the status, the reason, where a redirect points, the body's first bytes."""

    status: int
    reason: str
    location: str | None
    body: bytes


def host_header(url: str) -> str:
    """The ``Host`` a request to ``url`` carries, as SigV4 signs it: the host, with its port unless the scheme's."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    if parts.port is not None and parts.port != {"http": 80, "https": 443}.get(parts.scheme):
        host = f"{host}:{parts.port}"
    return host


def exchange(
    method: str,
    url: str,
    headers: Mapping[str, str],
    timeout: float,
    *,
    before_send: Callable[[], None] | None = None,
) -> Answer:
    """Send ``method url`` with ``headers`` and an empty body; the whole exchange within ``timeout`` seconds.
    ``before_send`` runs once connected, right before the request is written (what it raises, nothing is sent).

    Raises:
        OSError: no connection, a TLS failure, or no answer by the deadline (``TimeoutError``).
        http.client.HTTPException: an answer that is not well-formed HTTP (a garbled status line, a header line too
            long, a body cut short).
    """
    deadline = time.monotonic() + timeout
    parts = urlsplit(url)
    https = parts.scheme == "https"
    address = (parts.hostname or "", parts.port or (443 if https else 80))
    raw = socket.create_connection(address, timeout=max(0.001, min(CONNECT_SECONDS, _left(deadline))))
    try:
        sock = raw
        if https:
            raw.settimeout(_left(deadline))
            sock = ssl.create_default_context().wrap_socket(raw, server_hostname=parts.hostname)
        if before_send is not None:
            before_send()
        sock.settimeout(_left(deadline))
        sock.sendall(_request(method, url, headers))
        answer = http.client.HTTPResponse(BoundedSocket(sock, deadline), method=method)  # type: ignore[arg-type]
        answer.begin()
        failed = not 200 <= answer.status < 300 and answer.status != 304  # a 2xx body tells nothing more
        body = answer.read(BODY_BYTES) if failed and method != "HEAD" else b""
        return Answer(answer.status, answer.reason, answer.getheader("Location"), bytes(body))
    finally:
        raw.close()


def _request(method: str, url: str, headers: Mapping[str, str]) -> bytes:
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host_header(url)}"]
    lines += [f"{name}: {value}" for name, value in headers.items() if name.lower() not in ("host", "content-length")]
    lines += ["Content-Length: 0", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1")


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("no answer by the deadline")
    return left


class BoundedSocket:
    """A connected socket that ``http.client`` reads through: every read ends by ``deadline`` (``time.monotonic()``;
    a socket timeout only bounds the wait for each byte, and an answer trickled a byte at a time would never end)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_BoundedReader(self._sock, self._deadline))


class _BoundedReader(io.RawIOBase):
    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        self._sock.settimeout(_left(self._deadline))
        return self._sock.recv_into(buffer)
