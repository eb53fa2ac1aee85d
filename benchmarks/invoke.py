"""One cold Lambda invocation in a fresh interpreter: ``python -m benchmarks.invoke SPEC.json``.

The spec gives the environment (settings come from it, as in Lambda) and the event. The process prints one JSON line:
time from process start to the import done and to the handler's answer, peak RSS before and after the handler, and
the failures reported. With ``"stub": true`` every AWS call is answered in-process by a botocore ``before-send`` hook,
so a batch of 10,000 records measures the worker's own memory without waiting for moto at ~500 calls/s.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import xml.etree.ElementTree as ET
from typing import Any
from urllib.parse import parse_qs, urlsplit
from xml.sax.saxutils import escape

import psutil

STARTED = psutil.Process().create_time()
XML = {"Content-Type": "application/xml"}
JSON = {"Content-Type": "application/x-amz-json-1.1"}


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: Any) -> Any:
        yield self.body


def _listing(url: str) -> str:
    """Three objects under the prefix asked, in a listing that names its bucket (one that does not cannot say what
    is left, and the worker does not end a deletion on it)."""
    parts = urlsplit(url)
    bucket = parts.path.strip("/").split("/", 1)[0]  # path-style: the endpoint is a local address
    prefix = parse_qs(parts.query).get("prefix", [""])[0]
    contents = "".join(f"<Contents><Key>{prefix}part-{n:06d}</Key><Size>7</Size></Contents>" for n in range(3))
    return (
        f"<ListBucketResult><Name>{bucket}</Name><Prefix>{prefix}</Prefix><IsTruncated>false</IsTruncated>"
        f"<KeyCount>3</KeyCount>{contents}</ListBucketResult>"
    )


def _deleted(body: bytes) -> str:
    """A DeleteObjects answer naming every key asked as deleted (an answer that names fewer cannot say the rest went,
    and the worker lists them and sends them again)."""
    keys = [element.text or "" for element in ET.fromstring(body).iter() if element.tag.endswith("Key")]
    deleted = "".join(f"<Deleted><Key>{escape(key)}</Key></Deleted>" for key in keys)
    return f"<DeleteResult>{deleted}</DeleteResult>"


def _no_item(body: bytes | str) -> str:
    """A BatchGetItem answer naming every table asked, with no item under any key: every session was deleted (an
    answer that does not name the table cannot be told from a garbled one, and the fence frees nothing on it)."""
    tables = json.loads(body)["RequestItems"]
    return json.dumps({"Responses": {table: [] for table in tables}, "UnprocessedKeys": {}})


def stub_response(request: Any, event_name: str, **_: Any) -> Any:
    """A minimal successful answer to each call the worker makes."""
    from botocore.awsrequest import AWSResponse, HTTPHeaders

    operation = event_name.rsplit(".", 1)[-1]
    answers: dict[str, tuple[int, dict[str, str], str]] = {
        "RetireGrant": (200, JSON, "{}"),
        "DeleteConnection": (204, {}, ""),
        "GetBucketVersioning": (200, XML, "<VersioningConfiguration/>"),
    }
    if operation == "ListObjectsV2":
        status, headers, body = 200, XML, _listing(request.url)
    elif operation == "DeleteObjects":
        status, headers, body = 200, XML, _deleted(request.body)
    elif operation == "BatchGetItem":
        status, headers, body = 200, JSON, _no_item(request.body)
    else:
        status, headers, body = answers[operation]
    return AWSResponse(request.url, status, HTTPHeaders.from_dict(headers), _Raw(body.encode()))


def peak_rss_mb() -> float:
    """This process's peak RSS. ru_maxrss would carry the parent's peak across fork+exec; VmHWM starts afresh."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(path: str) -> None:
    with open(path) as spec_file:
        spec: dict[str, Any] = json.load(spec_file)
    os.environ.update(spec["env"])
    import worker.lambda_handler

    imported = time.time()
    runtime = worker.lambda_handler.warm.get()
    if spec.get("stub"):
        for client in (runtime.clients.s3, runtime.clients.kms, runtime.clients.dynamodb):
            client.meta.events.register("before-send", stub_response)
        if runtime.settings.ws_callback_url:
            runtime.clients.management(runtime.settings.ws_callback_url).meta.events.register(
                "before-send", stub_response
            )
    rss_before = peak_rss_mb()
    answered = time.time()
    response = worker.lambda_handler.handler(spec["event"], None)
    done = time.time()
    report = {
        "import_seconds": imported - STARTED,
        "first_answer_seconds": done - STARTED,
        "handler_seconds": done - answered,
        "rss_before_mb": rss_before,
        "peak_rss_mb": peak_rss_mb(),
        "failures": len(response["batchItemFailures"]),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
