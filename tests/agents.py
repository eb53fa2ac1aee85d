"""A misbehaving stand-in for the local AppConfig agent: a raw TCP server on 127.0.0.1 that answers each request with
the next of a list of canned byte strings (the last one for every request after), written all at once or a byte at a
time, and records how each answer ended.

``worker.local.appconfig.LocalAgent`` is a well-behaved agent; this one stands for what an agent, a sidecar being
replaced or anything else listening on the port may send: a garbled status line, a cut chunked body, more headers
than ``http.client`` accepts, a body trickled a byte at a time, an error status, nothing at all.
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

from worker.local.appconfig import flag


def ok(body: bytes) -> bytes:
    """A well-formed 200 answer carrying ``body``."""
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def status(code: int) -> bytes:
    """An error answer (a 503 is what the Lambda extension answers while it cannot reach AppConfig)."""
    body = json.dumps({"message": "unavailable"}).encode()
    return b"HTTP/1.1 %d Nope\r\nContent-Length: %d\r\n\r\n%s" % (code, len(body), body)


ENFORCE = ok(flag(True, "enforce"))
PAUSE = ok(flag(False))

GARBLES: dict[str, bytes] = {
    "bad status line": b"HTTP/1.1 2OO OK\r\nContent-Length: 2\r\n\r\n{}",
    "not http at all": b"SSH-2.0-OpenSSH_9.6\r\n",
    "cut chunked body": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n40\r\n" + flag(True, "enforce")[:20],
    "too many headers": b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: y\r\n" % n for n in range(150)) + b"\r\n",
    "cut body": b"HTTP/1.1 200 OK\r\nContent-Length: 400\r\n\r\n" + flag(True, "enforce"),
    "a status line too long": b"HTTP/1.1 200 " + b"O" * 70_000 + b"\r\n\r\n",
    "nested past the parser": ok(b'{"cleanup": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"),
    "not utf-8": ok(b'{"cleanup": {"enabled": \xff}}'),
    "a 503": status(503),
    "closed at once": b"",
}
"""Answers that are not a flag, by what is wrong with them (each is "cannot tell")."""


@dataclass
class Answered:
    """How one answer ended: how many of its bytes were written before the client went away (or all)."""

    sent: int
    length: int

    @property
    def complete(self) -> bool:
        return self.sent == self.length


@dataclass
class ScriptedAgent:
    """Answers the n-th request with ``answers[n]`` (the last one after that); ``trickle`` writes a byte at a time,
    ``trickle_seconds`` apart."""

    answers: list[bytes]
    trickle: bool = False
    names: tuple[str, str, str] = ("cleanup", "prod", "switch")
    trickle_seconds: float = 0.05
    answered: list[Answered] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def settings(self) -> dict[str, Any]:
        """The worker's settings pointing at this agent (read afresh on every use)."""
        application, environment, profile = self.names
        return {
            "appconfig_application": application,
            "appconfig_environment": environment,
            "appconfig_profile": profile,
            "appconfig_agent_url": self.url,
            "appconfig_poll_seconds": 0,
        }

    def __enter__(self) -> ScriptedAgent:
        thread = threading.Thread(target=self._accept, name="scripted-agent", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._server.close()

    def _accept(self) -> None:
        self._server.settimeout(0.1)
        while not self._stop.is_set():
            try:
                connection, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            answer = self.answers[min(len(self.answered), len(self.answers) - 1)]
            record = Answered(0, len(answer))
            self.answered.append(record)
            threading.Thread(target=self._answer, args=(connection, answer, record), daemon=True).start()

    def _answer(self, connection: socket.socket, answer: bytes, record: Answered) -> None:
        with connection:
            connection.settimeout(5)
            try:
                connection.recv(65_536)  # the request
                if not self.trickle:
                    connection.sendall(answer)
                    record.sent = len(answer)
                    return
                for offset in range(len(answer)):
                    if self._stop.wait(self.trickle_seconds):
                        return
                    connection.sendall(answer[offset : offset + 1])
                    record.sent = offset + 1
            except OSError:
                return  # the client hung up: ``record.sent`` says how far the answer got
