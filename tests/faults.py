"""Injecting service errors on a real botocore client, below its retry handler (``before-send``)."""

from __future__ import annotations

import json
import threading
from typing import Any

from botocore.awsrequest import AWSResponse


class RawBody:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Any:
        yield self._body

    def read(self, *_: Any) -> bytes:
        return self._body


class Faults:
    """Makes the next ``times`` calls of ``operation`` answer ``status`` with a JSON error ``code``."""

    def __init__(self, client: Any, operation: str, code: str, status: int = 400, times: int = 1) -> None:
        self.remaining = times
        self.sent = 0
        self.code = code
        self.status = status
        self._lock = threading.Lock()
        service = client.meta.service_model.service_id.hyphenize()
        client.meta.events.register(f"before-send.{service}.{operation}", self._answer)

    def _answer(self, request: Any, **_: Any) -> AWSResponse | None:
        with self._lock:
            self.sent += 1
            if self.remaining <= 0:
                return None
            self.remaining -= 1
        body = json.dumps({"__type": self.code, "message": "injected"}).encode()
        headers = {"x-amzn-ErrorType": self.code, "Content-Type": "application/x-amz-json-1.1"}
        return AWSResponse(request.url, self.status, headers, RawBody(body))


class Unprocessed:
    """Makes the next ``times`` BatchWriteItem calls of ``client`` process nothing: DynamoDB's answer under load,
    ``UnprocessedItems`` holding every request sent (nothing reaches the table). ``sizes`` records each call's count,
    ``attributes`` the attribute names of every key sent."""

    def __init__(self, client: Any, times: int = 1) -> None:
        self.remaining = times
        self.sizes: list[int] = []
        self.attributes: set[frozenset[str]] = set()
        self._lock = threading.Lock()
        client.meta.events.register("before-send.dynamodb.BatchWriteItem", self._answer)

    def _answer(self, request: Any, **_: Any) -> AWSResponse | None:
        requested = json.loads(request.body)["RequestItems"]
        with self._lock:
            self.sizes.append(sum(len(items) for items in requested.values()))
            self.attributes |= {frozenset(r["DeleteRequest"]["Key"]) for items in requested.values() for r in items}
            if self.remaining <= 0:
                return None
            self.remaining -= 1
        body = json.dumps({"UnprocessedItems": requested}).encode()
        return AWSResponse(request.url, 200, {"Content-Type": "application/x-amz-json-1.0"}, RawBody(body))


class Cut:
    """Makes the next ``times`` calls of ``operation`` answer 200 with ``body``: an empty or cut answer, which botocore
    parses into an answer without the fields the call should carry."""

    def __init__(self, client: Any, operation: str, body: bytes = b"", times: int = 1) -> None:
        self.remaining = times
        self.sent = 0
        self.body = body
        self._lock = threading.Lock()
        service = client.meta.service_model.service_id.hyphenize()
        client.meta.events.register(f"before-send.{service}.{operation}", self._answer)

    def _answer(self, request: Any, **_: Any) -> AWSResponse | None:
        with self._lock:
            self.sent += 1
            if self.remaining <= 0:
                return None
            self.remaining -= 1
        headers = {"Content-Type": "application/x-amz-json-1.1", "Content-Length": str(len(self.body))}
        return AWSResponse(request.url, 200, headers, RawBody(self.body))
