"""A local stand-in for the AppConfig agent (or Lambda extension), for the demo and the tests.

Both serve a profile's latest configuration at ``GET /applications/{app}/environments/{env}/configurations/{profile}``
on localhost. This server serves one body, set with ``serve`` (``flag`` builds the kill switch's), answers 404 for
any other path, and can be ``stop``-ped and ``start``-ed again on the same port to stand for an agent that is down.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def flag(enabled: bool, mode: str | None = None) -> bytes:
    """The body of a feature-flag profile holding the ``cleanup`` flag."""
    attributes: dict[str, Any] = {"enabled": enabled}
    if mode is not None:
        attributes["mode"] = mode
    return json.dumps({"cleanup": attributes}).encode()


class LocalAgent:
    """Serves one profile's body on 127.0.0.1 until stopped (a context manager)."""

    def __init__(self, application: str = "cleanup", environment: str = "prod", profile: str = "switch") -> None:
        self.names = (application, environment, profile)
        self.path = f"/applications/{application}/environments/{environment}/configurations/{profile}"
        self.body = flag(True, "enforce")
        self.requests = 0
        self.port = 0
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The worker's settings pointing at this agent."""
        application, environment, profile = self.names
        return {
            "APPCONFIG_APPLICATION": application,
            "APPCONFIG_ENVIRONMENT": environment,
            "APPCONFIG_PROFILE": profile,
            "APPCONFIG_AGENT_URL": self.url,
            "APPCONFIG_POLL_SECONDS": "0",
        }

    def serve(self, body: bytes) -> None:
        self.body = body

    def start(self) -> LocalAgent:
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                agent.requests += 1
                found = self.path.split("?")[0] == agent.path
                body = agent.body if found else b'{"message": "not found"}'
                self.send_response(200 if found else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, name="appconfig-agent", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop answering: connections to the port are refused until ``start``."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> LocalAgent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
