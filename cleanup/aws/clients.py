"""boto3 clients, created on first use and shared by every thread of the process.

Clients are never made at import time (cold start, and tests hand in their own endpoint). They come from a botocore
session rather than boto3's: the same clients, configuration and credential chain, without boto3's import of
s3transfer, which a cold start would pay for and the worker never uses. One botocore session serves the whole
process (it parses each service's model once, about 0.1 s for S3 and DynamoDB), unless one is handed in. botocore
clients are thread-safe once made, but making them is not, so creation holds one lock for the process. The HTTP
pool is sized to the worker's concurrency, or threads would queue for a connection.

Management API clients are one per callback endpoint, and endpoints come from items: they are kept in a small LRU
cache (``MANAGEMENT_CLIENTS``), so that many distinct endpoints cannot grow the process without bound (a client
holds its own service model and connection pool: about 130 KB each).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import botocore.session
from botocore.config import Config

from cleanup.aws.pacing import Pacer
from schemas.settings import Settings

if TYPE_CHECKING:  # the boto3-stubs of the test extra: at run time the clients are botocore's own
    from mypy_boto3_apigatewaymanagementapi import ApiGatewayManagementApiClient
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodbstreams import DynamoDBStreamsClient
    from mypy_boto3_kinesis import KinesisClient
    from mypy_boto3_kms import KMSClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sqs import SQSClient

MANAGEMENT_CLIENTS = 32

_creating = threading.Lock()  # botocore's client creation is not thread-safe, even across sessions' clients
_session: botocore.session.Session | None = None


def _process_session() -> botocore.session.Session:
    global _session
    if _session is None:
        _session = botocore.session.get_session()
    return _session


@dataclass(frozen=True)
class Reach:
    """Where, and as whom, the clients reach AWS when a command line says so (the AWS CLI's ``--region``,
    ``--profile`` and ``--endpoint-url``); what it leaves None is botocore's own configuration (AWS_DEFAULT_REGION,
    AWS_PROFILE, AWS_ENDPOINT_URL, the config files)."""

    region: str | None = None
    profile: str | None = None
    endpoint_url: str | None = None

    def session(self) -> botocore.session.Session | None:
        """A botocore session of ``profile`` (None without one: the process's serves)."""
        return botocore.session.Session(profile=self.profile) if self.profile else None


class Clients:
    """Lazily made AWS clients for one process. ``management(url)`` gives one client per callback endpoint."""

    def __init__(
        self, settings: Settings, session: botocore.session.Session | None = None, *, reach: Reach | None = None
    ) -> None:
        self._settings = settings
        self.reach = reach or Reach()
        self._session = session or self.reach.session()
        self._clients: dict[tuple[str, str | None], Any] = {}
        self._management: OrderedDict[tuple[str, str | None], Any] = OrderedDict()
        self.pacer = Pacer(settings)
        self.config = Config(
            max_pool_connections=settings.max_concurrency + 4,
            retries={"mode": "standard", "total_max_attempts": settings.botocore_max_attempts},
            connect_timeout=self.pacer.connect_timeout,
            # The pool's default; the pacer sets each request's own (by operation, and within the deadline).
            read_timeout=max(settings.http_timeout_seconds, settings.bulk_timeout_seconds),
        )

    def get(self, service: str, endpoint_url: str | None = None) -> Any:
        """The shared client for ``service`` (at ``endpoint_url`` when given)."""
        key = (service, endpoint_url)
        client = self._clients.get(key)
        if client is None:
            with _creating:
                client = self._clients.get(key)
                if client is None:
                    client = self._clients[key] = self._create(service, endpoint_url)
        return client

    def _create(self, service: str, endpoint_url: str | None, region: str | None = None) -> Any:
        """A new client (the caller holds ``_creating``)."""
        session = self._session or _process_session()
        region, endpoint_url = region or self.reach.region, endpoint_url or self.reach.endpoint_url
        client = session.create_client(service, region, endpoint_url=endpoint_url, config=self.config)
        self.pacer.attach(client)
        return client

    @property
    def s3(self) -> S3Client:
        return cast("S3Client", self.get("s3"))

    @property
    def kms(self) -> KMSClient:
        return cast("KMSClient", self.get("kms"))

    @property
    def dynamodb(self) -> DynamoDBClient:
        return cast("DynamoDBClient", self.get("dynamodb"))

    @property
    def streams(self) -> DynamoDBStreamsClient:
        return cast("DynamoDBStreamsClient", self.get("dynamodbstreams"))

    @property
    def kinesis(self) -> KinesisClient:
        return cast("KinesisClient", self.get("kinesis"))

    @property
    def sqs(self) -> SQSClient:
        return cast("SQSClient", self.get("sqs"))

    def management(self, callback_url: str, region: str | None = None) -> ApiGatewayManagementApiClient:
        """API Gateway Management API client for one WebSocket API stage, signing for ``region`` when given.

        The least recently used of more than MANAGEMENT_CLIENTS endpoints' clients is dropped (a call still using it
        finishes; its connections close when it is collected).
        """
        key = (callback_url, region)
        with _creating:
            client = self._management.get(key)
            if client is None:
                client = self._management[key] = self._create("apigatewaymanagementapi", callback_url, region)
                while len(self._management) > MANAGEMENT_CLIENTS:
                    self._management.popitem(last=False)
            else:
                self._management.move_to_end(key)
            return cast("ApiGatewayManagementApiClient", client)
