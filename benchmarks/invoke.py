"""A Lambda invocation in a fresh interpreter, cold or warm, its settings from the environment as in Lambda.

**Cold** (``python -m benchmarks.invoke SPEC.json``): the spec gives the environment and the event. The process
prints one JSON line: time from process start to the import done and to the handler's answer, peak RSS before and
after the handler, and the failures reported. With ``"stub": true`` every AWS call is answered in-process by a
botocore ``before-send`` hook, so a batch of 10,000 records measures the worker's own memory without waiting for moto
at ~500 calls/s.

**Warm**, against the stub AWS (``python benchmarks/invoke.py --warm SPEC OUT``): run as a script, so that the worker
it imports is whichever tree is first on ``PYTHONPATH`` (this one, or an earlier commit checked out beside it): the
CPU before and after a change are measured by the same code. Logs and metrics go to stdout, which the caller keeps
in a file, to quote when records fail. A first, small event warms the process (clients, pools, imports); the report
is for the second, written to OUT as JSON: wall and CPU seconds of the handler (every thread of the process), the
calls made by operation (botocore ``before-call``), the failures reported, and, when asked, the top of a cProfile of
the handler. Its profiling modules are imported there, so that a cold start's figures do not carry them.
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


def cold(path: str) -> None:
    """One cold invocation; the report is printed as one JSON line."""
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


def warm(spec_path: str, out_path: str) -> None:
    """Warm invocations against the stub AWS; the report is written to ``out_path``."""
    import cProfile
    import io
    import pstats
    import threading
    from collections import Counter

    with open(spec_path) as spec_file:
        spec: dict[str, Any] = json.load(spec_file)
    os.environ.update(spec["env"])
    import worker.lambda_handler

    # This tree's handler keeps its runtime in ``warm``; the commit measured as "before" had ``runtime()``.
    warm_runtime = getattr(worker.lambda_handler, "warm", None)
    runtime = warm_runtime.get() if warm_runtime is not None else worker.lambda_handler.runtime()  # type: ignore[attr-defined]
    calls: Counter[str] = Counter()
    lock = threading.Lock()

    def count(model: Any, **_: Any) -> None:
        with lock:
            calls[model.name] += 1

    clients = [runtime.clients.get(service) for service in ("s3", "kms", "dynamodb")]
    clients.append(runtime.clients.management(spec["env"]["WS_CALLBACK_URL"]))
    for client in clients:
        client.meta.events.register("before-call.*.*", count)
    first = worker.lambda_handler.handler(spec["warm"], None)
    calls.clear()
    profiles: list[cProfile.Profile] = []
    if spec.get("profile"):
        runtime.close()  # the pool's threads are made again, each with a profiler of its own
        threading.setprofile(lambda *_: _profile_thread(profiles))
        _profile_thread(profiles)
    started, cpu = time.perf_counter(), time.process_time()
    response = worker.lambda_handler.handler(spec["event"], None)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    runtime.close()
    report: dict[str, Any] = {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "calls": dict(calls),
        "failures": len(response["batchItemFailures"]) + len(first["batchItemFailures"]),
        "code": os.path.dirname(os.path.dirname(os.path.abspath(worker.lambda_handler.__file__))),
    }
    if profiles:
        text = io.StringIO()
        stats = pstats.Stats(*profiles, stream=text)
        stats.sort_stats(spec.get("profile_sort", "tottime")).print_stats(spec.get("profile_lines", 40))
        report["profile"] = text.getvalue()
    with open(out_path, "w") as out:
        json.dump(report, out)


def _profile_thread(profiles: list[Any]) -> None:
    """Profile the calling thread from now on (every thread of the worker's pool, and the main one)."""
    import cProfile

    profile = cProfile.Profile(time.thread_time)  # CPU, not the time spent waiting for answers or the GIL
    profiles.append(profile)
    profile.enable()


if __name__ == "__main__":
    if sys.argv[1] == "--warm":
        warm(sys.argv[2], sys.argv[3])
    else:
        cold(sys.argv[1])
