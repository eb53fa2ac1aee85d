"""A threaded reverse proxy on loopback that adds a fixed latency to every request, like a round trip to AWS; and
``ChildServer``, how it and the stub AWS run in a child process (their own interpreter, so their threads do not
share the measured worker's GIL; the child prints its URL as its first line of output, then serves until it is
terminated).

Each client connection gets a thread and its own keep-alive connection upstream, so the proxy adds latency without
adding a bottleneck of its own: N concurrent callers see N calls in flight. Run it as its own process
(``python -m benchmarks.latency_proxy --upstream URL --delay 0.02``): it prints its URL on the first line of stdout.
"""

from __future__ import annotations

import argparse
import http.client
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self
from urllib.parse import urlsplit


class ChildServer:
    """``python -m <module> <arguments>`` for the length of a ``with`` block; ``url`` is the line it printed."""

    def __init__(self, module: str, *arguments: str) -> None:
        self.command = [sys.executable, "-m", module, *arguments]
        self.url = ""
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> Self:
        self._process = subprocess.Popen(self.command, stdout=subprocess.PIPE, text=True)
        assert self._process.stdout is not None
        self.url = self._process.stdout.readline().strip()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(10)


HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


def make_handler(upstream: str, delay: float) -> type[BaseHTTPRequestHandler]:
    target = urlsplit(upstream)
    host, port = target.hostname or "127.0.0.1", target.port or 80

    class Forward(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as botocore's pool expects

        def setup(self) -> None:
            super().setup()
            self.upstream = http.client.HTTPConnection(host, port, timeout=60)

        def finish(self) -> None:
            super().finish()
            self.upstream.close()

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            time.sleep(delay)
            try:
                self.upstream.request(self.command, self.path, body=body, headers=headers)
                response = self.upstream.getresponse()
                payload = response.read()
            except (OSError, http.client.HTTPException):
                self.upstream.close()  # reconnect once: the upstream may have closed an idle connection
                self.upstream.request(self.command, self.path, body=body, headers=headers)
                response = self.upstream.getresponse()
                payload = response.read()
            self.send_response_only(response.status, response.reason)
            for name, value in response.getheaders():
                if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _forward

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Forward


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # 64 callers opening connections at once must not be refused


def serve(upstream: str, delay: float, port: int = 0) -> None:
    server = Server(("127.0.0.1", port), make_handler(upstream, delay))
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


class LatencyProxy(ChildServer):
    """The proxy in a child process."""

    def __init__(self, upstream: str, delay: float) -> None:
        super().__init__("benchmarks.latency_proxy", "--upstream", upstream, "--delay", str(delay))
        self.upstream = upstream
        self.delay = delay


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--delay", type=float, default=0.02)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    serve(args.upstream, args.delay, args.port)


if __name__ == "__main__":
    main()
