"""A stub AWS much lighter than moto: the handful of operations the worker calls, answered from memory.

An aiohttp server on loopback in a process of its own (``python -m benchmarks.stub_aws --latency 0.02``; it prints
its URL on the first line of stdout). The worker reaches it over HTTP with its real botocore clients, so serialising,
signing, sending and parsing are all measured; only the server's own work is gone. Every answer waits ``latency``
seconds first (an asyncio sleep: hundreds of calls wait at once without a thread each), like a round trip to AWS.

Served: DynamoDB GetItem and BatchGetItem (no live item: every session was deleted), KMS ListGrants and RetireGrant, S3
GetBucketVersioning, ListObjectsV2 (``encoding-type=url`` honoured, pages of ``max-keys``) and DeleteObjects, and the
Management API's DeleteConnection. Control paths under ``/_stub/`` load sessions (``populate``), say what is left
(``observe``) and count the calls by operation (``calls``).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import urllib.request
import xml.etree.ElementTree as ET
from collections import Counter
from typing import Any
from urllib.parse import quote

from aiohttp import web

from benchmarks.latency_proxy import ChildServer

S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


class State:
    """Objects, grants and connections, by the names the worker sends."""

    def __init__(self) -> None:
        self.keys: dict[str, list[str]] = {}  # bucket -> sorted keys ever put
        self.live: dict[str, set[str]] = {}  # bucket -> keys not deleted
        self.grants: set[str] = set()
        self.grant_names: dict[str, str] = {}
        self.connections: set[str] = set()
        self.calls: Counter[str] = Counter()

    def populate(self, spec: dict[str, Any]) -> None:
        bucket = spec["bucket"]
        keys = self.keys.setdefault(bucket, [])
        live = self.live.setdefault(bucket, set())
        new = [f"{prefix}part-{n:06d}" for prefix in spec["prefixes"] for n in range(spec["objects"])]
        live.update(new)
        keys[:] = sorted(set(keys) | set(new))
        self.grants.update(spec.get("grants", []))
        self.grant_names.update(spec.get("grant_names", {}))
        self.connections.update(spec.get("connections", []))

    def observe(self, spec: dict[str, Any]) -> dict[str, int]:
        return {
            "objects": len(self.live.get(spec["bucket"], ())),
            "grants": len(self.grants & set(spec.get("grants", []))),
            "sockets_open": len(self.connections & set(spec.get("connections", []))),
        }

    def listing(self, bucket: str, prefix: str, start_after: str, max_keys: int) -> tuple[list[str], bool]:
        keys, live = self.keys.get(bucket, []), self.live.get(bucket, set())
        found: list[str] = []
        for key in keys[
            bisect.bisect_right(keys, max(prefix, start_after)) if start_after else bisect.bisect_left(keys, prefix) :
        ]:
            if not key.startswith(prefix):
                return found, False
            if key in live:
                if len(found) == max_keys:
                    return found, True
                found.append(key)
        return found, False


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(status=status, body=json.dumps(body).encode(), content_type="application/x-amz-json-1.0")


def _xml(body: str) -> web.Response:
    return web.Response(body=body.encode(), content_type="application/xml")


class Stub:
    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.state = State()

    async def handle(self, request: web.Request) -> web.Response:
        if request.path.startswith("/_stub/"):
            return await self._control(request)
        body = await request.read()
        await asyncio.sleep(self.latency)
        target = request.headers.get("X-Amz-Target", "")
        if target:
            return self._json_api(target.rsplit(".", 1)[-1], json.loads(body or b"{}"))
        if "/@connections/" in request.path and request.method == "DELETE":
            self.state.calls["DeleteConnection"] += 1
            connection = request.path.rsplit("/", 1)[-1]
            if connection not in self.state.connections:
                return web.Response(status=410, text='{"message": "Gone"}', content_type="application/json")
            self.state.connections.discard(connection)
            return web.Response(status=204)
        return self._s3(request, body)

    def _json_api(self, operation: str, body: dict[str, Any]) -> web.Response:
        self.state.calls[operation] += 1
        if operation == "GetItem":
            return _json({})
        if operation == "BatchGetItem":
            return _json({"Responses": {table: [] for table in body["RequestItems"]}, "UnprocessedKeys": {}})
        if operation == "ListGrants":  # by grant id: the grant's Name (SESSION_BINDING), or none once retired
            grant = body.get("GrantId", "")
            listed = (
                [{"GrantId": grant, "Name": self.state.grant_names.get(grant, "")}]
                if grant in self.state.grants
                else []
            )
            return _json({"Grants": listed, "Truncated": False})
        if operation == "RetireGrant":
            self.state.grants.discard(body.get("GrantId", ""))
            return _json({})
        return _json({"__type": "UnknownOperationException", "message": operation}, 400)

    def _s3(self, request: web.Request, body: bytes) -> web.Response:
        bucket = request.path.strip("/").split("/", 1)[0]
        query = request.query
        if request.method == "GET" and "versioning" in query:
            self.state.calls["GetBucketVersioning"] += 1
            return _xml(f'<VersioningConfiguration xmlns="{S3_NS[1:-1]}"/>')
        if request.method == "GET" and query.get("list-type") == "2":
            self.state.calls["ListObjectsV2"] += 1
            return self._list(bucket, query)
        if request.method == "POST" and "delete" in query:
            self.state.calls["DeleteObjects"] += 1
            return self._delete(bucket, body)
        return web.Response(status=501, text=f"{request.method} {request.path_qs}")

    def _list(self, bucket: str, query: Any) -> web.Response:
        prefix, encode = query.get("prefix", ""), query.get("encoding-type") == "url"
        keys, truncated = self.state.listing(
            bucket, prefix, query.get("start-after", ""), int(query.get("max-keys", 1000))
        )
        contents = "".join(
            f"<Contents><Key>{quote(key, safe='/') if encode else key}</Key><Size>7</Size></Contents>" for key in keys
        )
        encoding = "<EncodingType>url</EncodingType>" if encode else ""
        return _xml(
            f'<ListBucketResult xmlns="{S3_NS[1:-1]}"><Name>{bucket}</Name><Prefix>{prefix}</Prefix>'
            f"<KeyCount>{len(keys)}</KeyCount><MaxKeys>1000</MaxKeys>{encoding}"
            f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>{contents}</ListBucketResult>"
        )

    def _delete(self, bucket: str, body: bytes) -> web.Response:
        root = ET.fromstring(body)
        live = self.state.live.setdefault(bucket, set())
        quiet = (root.findtext(f"{S3_NS}Quiet") or root.findtext("Quiet") or "").lower() == "true"
        deleted = []
        for entry in [*root.iter(f"{S3_NS}Object"), *root.iter("Object")]:
            key = entry.findtext(f"{S3_NS}Key") or entry.findtext("Key") or ""
            live.discard(key)
            deleted.append(key)
        answer = "" if quiet else "".join(f"<Deleted><Key>{key}</Key></Deleted>" for key in deleted)
        return _xml(f'<DeleteResult xmlns="{S3_NS[1:-1]}">{answer}</DeleteResult>')

    async def _control(self, request: web.Request) -> web.Response:
        command = request.path.removeprefix("/_stub/")
        spec = await request.json() if request.can_read_body else {}
        if command == "populate":
            self.state.populate(spec)
            return web.json_response({})
        if command == "observe":
            return web.json_response(self.state.observe(spec))
        if command == "calls":
            calls, self.state.calls = self.state.calls, Counter()
            return web.json_response(dict(calls))
        return web.json_response({"error": command}, status=404)


def serve(latency: float) -> None:
    stub = Stub(latency)
    app = web.Application(client_max_size=16 * 2**20)
    app.router.add_route("*", "/{tail:.*}", stub.handle)

    async def start() -> None:
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        port = runner.addresses[0][1]
        print(f"http://127.0.0.1:{port}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(start())


class StubAws(ChildServer):
    """The stub in a child process."""

    def __init__(self, latency: float) -> None:
        super().__init__("benchmarks.stub_aws", "--latency", str(latency))
        self.latency = latency

    def control(self, command: str, **spec: Any) -> Any:
        request = urllib.request.Request(f"{self.url}/_stub/{command}", data=json.dumps(spec).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--latency", type=float, default=0.02)
    serve(parser.parse_args().latency)


if __name__ == "__main__":
    main()
