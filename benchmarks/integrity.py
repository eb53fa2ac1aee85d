"""What the integrity tag costs per message: KMS calls, and milliseconds of local work and of the calls.

.venv/bin/python -m benchmarks.integrity [--messages 200]

A message is tagged once when it is written (one GenerateMac) and checked once when it is read (one VerifyMac); a
record stored in S3 costs nothing more (its digest is inside the tagged message). The local work, the message put in
canonical JSON and hashed with SHA-256, is measured for a typical message (a session's key and attributes) and for
the largest a queue takes (1 MiB). The calls' time is measured against the local moto server, over HTTP: it is the
client's own cost (signing, serialising, one round trip on the loopback) and says nothing of KMS's latency in a
Region, which adds its round trip (a few milliseconds within a Region) to each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable
from functools import partial

from cleanup.queues.integrity import seal, signed_bytes
from cleanup.queues.integrity_check import verify
from cleanup.runtime import Runtime
from schemas.settings import Settings
from worker.local.backend import LocalAws


def message(payload: int) -> str:
    """A dead-letter message with a record of about ``payload`` bytes of session attributes."""
    image = {"pk": {"S": "session#abc"}, "sk": {"S": "meta"}, "tenantId": {"S": "t" * max(1, payload)}}
    record = {"eventName": "REMOVE", "dynamodb": {"Keys": {"pk": image["pk"]}, "OldImage": image}}
    return json.dumps({"format": "session-cleanup.dead-letter.v1", "sequenceNumber": "1", "record": record})


def timed(work: Callable[[], object], times: int) -> float:
    """Median milliseconds of ``work`` over ``times`` runs."""
    spent = []
    for _ in range(times):
        start = time.perf_counter()
        work()
        spent.append((time.perf_counter() - start) * 1000)
    return statistics.median(spent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200)
    args = parser.parse_args()
    with LocalAws() as aws:
        os.environ.update(aws.environment())
        runtime = Runtime(Settings(metrics_destination="off"))
        kms = runtime.clients.kms
        key = kms.create_key(KeySpec="HMAC_256", KeyUsage="GENERATE_VERIFY_MAC")["KeyMetadata"]["Arn"]
        runtime = Runtime(Settings(metrics_destination="off", integrity_key_id=key))
        calls: Counter[str] = Counter()
        runtime.clients.kms.meta.events.register("before-call.kms", lambda model, **_: calls.update([model.name]))
        print("| message | local digest (ms) | tag: GenerateMac (ms) | check: VerifyMac (ms) | KMS calls per message |")
        print("|---|---|---|---|---|")
        for name, size in (("typical (~0.5 KB)", 300), ("256 KB", 256_000), ("1 MiB", 1_040_000)):
            body = message(size)
            times = args.messages if size < 10_000 else max(10, args.messages // 10)
            digest_ms = timed(partial(signed_bytes, json.loads(body)), times)
            calls.clear()
            seal_ms = timed(partial(seal, body, runtime), times)
            sealed = json.loads(seal(body, runtime))
            verify_ms = timed(partial(verify, sealed, runtime), times)
            write, read = calls["GenerateMac"] / (times + 1), calls["VerifyMac"] / times
            figures = f"{digest_ms:.3f} | {seal_ms:.2f} | {verify_ms:.2f}"
            print(f"| {name} | {figures} | {write:g} to write, {read:g} to read |")


if __name__ == "__main__":
    main()
