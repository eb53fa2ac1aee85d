"""A session stack in moto for tests: table with stream, bucket, key; sessions; and the stream read back as events."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import boto3
from botocore.config import Config

from cleanup.actions.api import Gate
from cleanup.aws.clients import Clients
from cleanup.aws.permits import Permit
from cleanup.runtime import Runtime
from cleanup.streams.reader import raw_get_records
from cleanup.telemetry import Metrics, MetricsSink
from schemas.settings import Settings
from worker.local.backend import DEFAULT_ACCOUNT_ID, LocalAws, create_session_table

REGION = "us-east-1"


def client(service: str, **config: Any) -> Any:
    """A new boto3 client of the test server (a test may hook it without touching any other), from the tests' own
    session: what a test sets up or tears down is no worker's call, and boto3's default session is held to the
    send-time check (``tests.conftest``)."""
    return harness_session().client(service, region_name=REGION, config=Config(**config) if config else None)


@cache
def harness_session() -> boto3.session.Session:
    """The tests' own boto3 session (not boto3's default one, which the suite holds to the send-time check)."""
    return boto3.session.Session()


@cache
def shared_client(service: str) -> Any:
    """The stacks' own client for ``service``, made once: a stack's set-up and observations hook nothing."""
    return client(service)


def table_exists(ddb: Any, name: str) -> bool:
    """Whether table ``name`` exists, asked of the table itself. ``ListTables`` answers one page of 100 names, and the
    run's one server holds more tables than that once a worker has run a hundred stacks: a name past the first page
    would read as missing."""
    try:
        ddb.describe_table(TableName=name)
    except ddb.exceptions.ResourceNotFoundException:
        return False
    return True


@dataclass
class SessionStack:
    aws: LocalAws
    table: str
    bucket: str
    key_arn: str
    stream_arn: str
    ddb: Any = field(repr=False)
    s3: Any = field(repr=False)
    kms: Any = field(repr=False)
    streams: Any = field(repr=False)
    mac_key_arn: str = ""
    """The HMAC key that tags the worker's own messages (INTEGRITY_KEY_ID)."""
    _iterator: str | None = None

    @classmethod
    def create(
        cls, aws: LocalAws, test_name: str, *, versioned: bool = False, view_type: str = "NEW_AND_OLD_IMAGES"
    ) -> SessionStack:
        suffix = hashlib.sha1(f"{test_name}{uuid.uuid4()}".encode()).hexdigest()[:10]
        ddb, s3, kms = shared_client("dynamodb"), shared_client("s3"), shared_client("kms")
        table = f"sessions-{suffix}"
        stream_arn = create_session_table(ddb, table, view_type=view_type)
        bucket = f"scratch-{suffix}"
        s3.create_bucket(Bucket=bucket)
        if versioned:
            s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        key_arn = kms.create_key(Description=f"grants for {table}")["KeyMetadata"]["Arn"]
        mac_key = kms.create_key(Description=f"messages of {table}", KeySpec="HMAC_256", KeyUsage="GENERATE_VERIFY_MAC")
        return cls(
            aws=aws,
            table=table,
            bucket=bucket,
            key_arn=key_arn,
            stream_arn=str(stream_arn),
            ddb=ddb,
            s3=s3,
            kms=kms,
            streams=shared_client("dynamodbstreams"),
            mac_key_arn=mac_key["KeyMetadata"]["Arn"],
        )

    # Settings and runtime pointed at this stack.
    def settings(self, **overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "scratch_bucket": self.bucket,
            "kms_key_id": self.key_arn,
            "integrity_key_id": self.mac_key_arn,
            "session_table": self.table,
            "metrics_destination": "off",
            "retry_max_wait_seconds": 0.05,
            "expiry_index": "expiry-index",
        }
        values.update(overrides)
        return Settings(**values)

    def runtime(self, **overrides: Any) -> Runtime:
        settings = self.settings(**overrides)
        return Runtime(settings, Clients(settings), Metrics(settings, MetricsSink("off")))

    # Sessions.
    def put_session(
        self,
        session_id: str,
        *,
        tenant: str = "t1",
        connection_id: str | None = None,
        objects: int = 3,
        grant: bool = True,
        ttl: int | None = None,
        extra: dict[str, Any] | None = None,
        prefix: str | None = None,
    ) -> dict[str, Any]:
        """Create a session's resources and its item; returns the item as plain values. ``prefix``: its scratch
        prefix (default: the tenant's folder of the session, ``sessions/<tenant>/<id>/``)."""
        prefix = prefix or f"sessions/{tenant}/{session_id}/"
        for n in range(objects):
            self.s3.put_object(Bucket=self.bucket, Key=f"{prefix}part-{n:05d}", Body=b"scratch")
        item: dict[str, Any] = {
            "pk": f"session#{session_id}",
            "sk": "meta",
            "tenantId": tenant,
            "scratchPrefix": prefix,
            "ttl": ttl if ttl is not None else int(time.time()) + 3600,
        }
        if connection_id:
            item["connectionId"] = connection_id
        if grant:
            item["grantId"] = self.kms.create_grant(
                KeyId=self.key_arn,
                GranteePrincipal="arn:aws:iam::123456789012:role/agent",
                Operations=["Decrypt"],
                Name=f"session:{session_id}",  # bound to its session (SESSION_BINDING)
            )["GrantId"]
        item.update(extra or {})
        self.put_item(item)
        return item

    def put_objects(self, keys: list[str], bucket: str | None = None) -> None:
        """Many scratch objects at once, written straight into moto's in-process S3 (set-up only: the worker still
        lists and deletes them over HTTP). A versioned bucket gets a new version per put."""
        from moto.s3.models import s3_backends

        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
        for key in keys:
            backend.put_object(bucket or self.bucket, key, b"scratch")

    def put_item(self, item: dict[str, Any]) -> None:
        self.ddb.put_item(TableName=self.table, Item=to_av(item))

    def delete(self, session_id: str) -> None:
        self.ddb.delete_item(TableName=self.table, Key=self.key(session_id))

    def expire(self, session_id: str) -> None:
        """Delete the item as DynamoDB TTL would (userIdentity Service / dynamodb.amazonaws.com)."""
        self.aws.expire_by_ttl(self.table, self.key(session_id))

    @staticmethod
    def key(session_id: str) -> dict[str, Any]:
        return {"pk": {"S": f"session#{session_id}"}, "sk": {"S": "meta"}}

    # The stream, read back as the service returns it.
    def new_records(self) -> list[dict[str, Any]]:
        """Records written since the last call, as raw GetRecords JSON."""
        if self._iterator is None:
            shard = self.streams.describe_stream(StreamArn=self.stream_arn)["StreamDescription"]["Shards"][0]
            self._iterator = self.streams.get_shard_iterator(
                StreamArn=self.stream_arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
            )["ShardIterator"]
        records: list[dict[str, Any]] = []
        while True:
            page = raw_get_records(self.streams, self._iterator)
            self._iterator = page["NextShardIterator"]
            records.extend(page["Records"])
            if not page["Records"]:
                return records

    def lambda_event(self, records: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Records as a Lambda event source mapping delivers them."""
        records = self.new_records() if records is None else records
        return {"Records": [{**json.loads(json.dumps(r)), "eventSourceARN": self.stream_arn} for r in records]}

    # Observations.
    def objects(self, prefix: str = "") -> list[str]:
        keys = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            keys += [o["Key"] for o in page.get("Contents", [])]
        return keys

    def versions(self, prefix: str = "") -> int:
        count = 0
        for page in self.s3.get_paginator("list_object_versions").paginate(Bucket=self.bucket, Prefix=prefix):
            count += len(page.get("Versions", [])) + len(page.get("DeleteMarkers", []))
        return count

    def grant_ids(self) -> set[str]:
        return {g["GrantId"] for g in self.kms.list_grants(KeyId=self.key_arn)["Grants"]}


def to_av(item: dict[str, Any]) -> dict[str, Any]:
    from boto3.dynamodb.types import TypeSerializer

    serializer = TypeSerializer()
    return {name: serializer.serialize(value) for name, value in item.items()}


def open_gate() -> Gate:
    """A gate whose permit lets every call go (it covers every target): for the tests of one action alone, where no
    session item is read (the fence itself is tested through the pipeline)."""
    return Gate(lambda deadline, reading: Permit("test", prefixes=("",)), "test")


unfenced = open_gate()


def page_gate(bucket: str, prefix: str) -> Gate:
    """A gate whose permit covers the keys under one prefix, as a scratch step's does (no session item is read)."""
    return Gate(lambda deadline, reading: Permit("scratch", prefixes=(f"s3:{bucket}/{prefix}",)), "scratch")
