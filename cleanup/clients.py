"""boto3 clients, created on first use and shared by every thread of the process.

Clients are never made at import time (cold start, and tests hand in their own endpoint). They come from a botocore
session rather than boto3's: the same clients, configuration and credential chain, without boto3's import of
s3transfer, which a cold start would pay for and the worker never uses. botocore clients are
thread-safe once made, but making them is not, so creation holds a lock. The HTTP pool is sized to the worker's
concurrency, or threads would queue for a connection.
"""

from __future__ import annotations

import threading
from typing import Any

import botocore.session
from botocore.config import Config

from schemas.settings import Settings


class Clients:
    """Lazily made AWS clients for one process. ``management(url)`` gives one client per callback endpoint."""

    def __init__(self, settings: Settings, session: botocore.session.Session | None = None) -> None:
        self._settings = settings
        self._session = session
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, str | None], Any] = {}
        self.config = Config(
            max_pool_connections=settings.max_concurrency + 4,
            retries={"mode": "standard", "total_max_attempts": settings.botocore_max_attempts},
            connect_timeout=settings.http_timeout_seconds,
            read_timeout=settings.http_timeout_seconds,
        )

    def get(self, service: str, endpoint_url: str | None = None) -> Any:
        """The shared client for ``service`` (at ``endpoint_url`` when given)."""
        key = (service, endpoint_url)
        client = self._clients.get(key)
        if client is None:
            with self._lock:
                client = self._clients.get(key)
                if client is None:
                    if self._session is None:
                        self._session = botocore.session.get_session()
                    client = self._session.create_client(service, endpoint_url=endpoint_url, config=self.config)
                    self._clients[key] = client
        return client

    @property
    def s3(self) -> Any:
        return self.get("s3")

    @property
    def kms(self) -> Any:
        return self.get("kms")

    @property
    def dynamodb(self) -> Any:
        return self.get("dynamodb")

    @property
    def sqs(self) -> Any:
        return self.get("sqs")

    def management(self, callback_url: str) -> Any:
        """API Gateway Management API client for one WebSocket API stage."""
        return self.get("apigatewaymanagementapi", callback_url)
