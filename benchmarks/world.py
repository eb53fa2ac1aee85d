"""The AWS side of the benchmarks, in a process of its own: moto over HTTP, the local WebSocket gateway, and set-up.

The worker under test runs in the parent process, so what it measures (time, memory, calls) is its own and not moto's.
Set-up goes through moto's in-process backends where HTTP would dominate the run (3 objects and a grant per session:
a few thousand puts), and through HTTP where the wire shape matters (the session items, and the stream read back with
GetRecords exactly as a Lambda event source mapping would deliver it).
"""

from __future__ import annotations

import json
import multiprocessing
import uuid
from multiprocessing.connection import Connection
from typing import Any

ACCOUNT = "123456789012"
REGION = "us-east-1"
GRANTEE = "arn:aws:iam::123456789012:role/agent"


class _World:
    """Lives in the child process; each public method is a command the parent may send."""

    def __init__(self) -> None:
        import boto3

        from worker.local.backend import LocalAws
        from worker.local.gateway import LocalGateway

        self.aws = LocalAws(REGION).start()
        self.aws.use()
        self.gateway = LocalGateway().start()
        self.ddb: Any = boto3.client("dynamodb")
        self.s3 = boto3.client("s3")
        self.kms = boto3.client("kms")
        self.streams = boto3.client("dynamodbstreams")
        self.sockets: dict[str, list[Any]] = {}

    def endpoints(self) -> dict[str, str]:
        return {"aws": self.aws.endpoint_url, "gateway": self.gateway.callback_url}

    def populate(self, sessions: int, *, objects: int = 3, grant: bool = True, sockets: bool = True) -> dict[str, Any]:
        """A fresh table, bucket and key; ``sessions`` sessions created then deleted; their REMOVE records."""
        from moto.kms.models import kms_backends
        from moto.s3.models import s3_backends

        name = uuid.uuid4().hex[:10]
        table, bucket = f"sessions-{name}", f"scratch-{name}"
        from worker.local.backend import create_session_table

        stream_arn = str(create_session_table(self.ddb, table, ttl=False))
        self.s3.create_bucket(Bucket=bucket)
        key = self.kms.create_key(Description=table)["KeyMetadata"]
        s3_backend, kms_backend = s3_backends[ACCOUNT]["aws"], kms_backends[ACCOUNT][REGION]
        items = []
        for n in range(sessions):
            prefix = f"sessions/t{n % 7}/{name}-{n}/"
            for part in range(objects):
                s3_backend.put_object(bucket, f"{prefix}part-{part:06d}", b"scratch")
            item = {"pk": {"S": f"session#{name}-{n}"}, "sk": {"S": "meta"}, "tenantId": {"S": f"t{n % 7}"}}
            item |= {"scratchPrefix": {"S": prefix}, "ttl": {"N": "1700000000"}}
            if grant:
                name_ = f"session:{name}-{n}"  # bound to its session (SESSION_BINDING)
                grant_id, _ = kms_backend.create_grant(key["KeyId"], GRANTEE, ["Decrypt"], name_, {}, GRANTEE)
                item["grantId"] = {"S": grant_id}
            if sockets:
                client = self.gateway.connect()
                self.sockets.setdefault(bucket, []).append(client)
                item["connectionId"] = {"S": client.connection_id}
            items.append(item)
        self._write(table, [{"PutRequest": {"Item": item}} for item in items])
        self._write(table, [{"DeleteRequest": {"Key": {"pk": i["pk"], "sk": i["sk"]}}} for i in items])
        records = [r for r in self._stream(stream_arn) if r["eventName"] == "REMOVE"]
        event = {"Records": [{**r, "eventSourceARN": stream_arn} for r in records]}
        return {"event": event, "table": table, "bucket": bucket, "key_arn": key["Arn"]}

    def observe(self, bucket: str, key_arn: str) -> dict[str, int]:
        """What is left of the sessions: objects in the bucket, grants on the key, sockets open, DELETEs served."""
        from moto.s3.models import s3_backends

        objects = len(list(s3_backends[ACCOUNT]["aws"].get_bucket(bucket).keys.keys()))
        grants = len(self.kms.list_grants(KeyId=key_arn)["Grants"])
        open_ids = self.gateway.connection_ids()
        sockets = sum(client.connection_id in open_ids for client in self.sockets.get(bucket, []))
        return {"objects": objects, "grants": grants, "sockets_open": sockets}

    def _write(self, table: str, requests: list[dict[str, Any]]) -> None:
        for start in range(0, len(requests), 25):
            self.ddb.batch_write_item(RequestItems={table: requests[start : start + 25]})

    def _stream(self, stream_arn: str) -> list[dict[str, Any]]:
        from cleanup.streams.reader import raw_get_records

        shard = self.streams.describe_stream(StreamArn=stream_arn)["StreamDescription"]["Shards"][0]
        iterator = self.streams.get_shard_iterator(
            StreamArn=stream_arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        records: list[dict[str, Any]] = []
        while True:
            page = raw_get_records(self.streams, iterator)
            iterator = page["NextShardIterator"]
            records.extend(page["Records"])
            if not page["Records"]:
                return records


def _serve(conn: Connection) -> None:
    world = _World()
    conn.send(world.endpoints())
    while True:
        message = conn.recv()
        if message is None:
            break
        command, kwargs = message
        try:
            conn.send(("ok", json.dumps(getattr(world, command)(**kwargs))))
        except Exception as exc:  # the parent re-raises it with the child's message
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
    world.gateway.stop()
    world.aws.stop()


class World:
    """The parent's handle on the child process. Use as a context manager."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child,), daemon=True)
        self.endpoints: dict[str, str] = {}

    def __enter__(self) -> World:
        self._process.start()
        self.endpoints = self._conn.recv()
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.send(None)
        self._process.join(30)

    def call(self, command: str, **kwargs: Any) -> Any:
        self._conn.send((command, kwargs))
        status, payload = self._conn.recv()
        if status != "ok":
            raise RuntimeError(f"world.{command}: {payload}")
        return json.loads(payload)

    def populate(self, sessions: int, **kwargs: Any) -> dict[str, Any]:
        return dict(self.call("populate", sessions=sessions, **kwargs))

    def observe(self, batch: dict[str, Any]) -> dict[str, int]:
        return dict(self.call("observe", bucket=batch["bucket"], key_arn=batch["key_arn"]))
