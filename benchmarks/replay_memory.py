"""Peak RSS of ``cleanup-worker replay`` on a small and on a large JSON-lines file: memory must not grow with the file.

Each file holds REMOVE records of about 700 bytes (the size of a session's record with its old image, as in the
50,000-record, 35 MB capture that took 510 MB when replay read it whole). Their items carry no resource, so the
pipeline decodes and classifies each record (skipped: not a session) and makes no AWS call: what is measured is the
reading, the batching and the report, not moto. Each replay runs in a process of its own; its peak RSS is the
kernel's ``ru_maxrss`` for that child.

Run: ``python -m benchmarks.replay_memory [--small 1000] [--large 50000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PADDING = "x" * 120  # brings a record to about 700 bytes, like a captured session record


def record(n: int) -> dict[str, object]:
    """One REMOVE record, as ``capture`` writes it, of an item that holds nothing to clean."""
    keys = {"pk": {"S": f"session#s-{n}"}, "sk": {"S": "meta"}}
    return {
        "eventID": f"{n:032x}",
        "eventName": "REMOVE",
        "eventVersion": "1.1",
        "eventSource": "aws:dynamodb",
        "awsRegion": "us-east-1",
        "eventSourceARN": "arn:aws:dynamodb:us-east-1:123456789012:table/sessions/stream/2026-01-01T00:00:00.000",
        "dynamodb": {
            "ApproximateCreationDateTime": 1767225600,
            "Keys": keys,
            "OldImage": {**keys, "tenantId": {"S": "t1"}, "ttl": {"N": "1767225000"}, "note": {"S": PADDING}},
            "SequenceNumber": f"{1_000_000_000_000 + n:021d}",
            "SizeBytes": 680,
            "StreamViewType": "NEW_AND_OLD_IMAGES",
        },
    }


def write_file(path: Path, count: int) -> int:
    with path.open("w") as out:
        for n in range(count):
            out.write(json.dumps(record(n), separators=(",", ":")) + "\n")
    return path.stat().st_size


def peak_rss_mb(path: Path, source: str | None = None) -> tuple[float, dict[str, object]]:
    """Replay ``path`` in a child process (with the code of the checkout ``source``, when given); its peak RSS in MB
    and its JSON summary."""
    env = {
        **os.environ,
        **({"PYTHONPATH": source} if source else {}),
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",  # refuses replay's DescribeTable; nothing in the files is a session
        "SESSION_TABLE": "sessions",  # the table the records come from (replay trusts no other's)
        "METRICS_DESTINATION": "off",
        "LOG_LEVEL": "WARNING",
    }
    command = [sys.executable, "-m", "worker.cli", "replay", "--json", str(path)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, env=env, cwd=source)
    assert child.stdout is not None
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, output[-2000:]
    summary = json.loads(output)
    return usage.ru_maxrss / 1024, {key: summary[key] for key in ("records", "skipped")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--large", type=int, default=50_000)
    parser.add_argument("--source", help="measure another checkout's code (e.g. the version before streaming)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        figures = []
        for label, count in (("small", args.small), ("large", args.large)):
            path = Path(folder) / f"{label}.jsonl"
            size = write_file(path, count)
            rss, summary = peak_rss_mb(path, args.source)
            figures.append(rss)
            print(f"{label:5}  {count:>7,} records  {size / 1e6:6.1f} MB file  peak RSS {rss:6.1f} MB  {summary}")
        print(f"peak RSS large/small: {figures[1] / figures[0]:.2f}")


if __name__ == "__main__":
    main()
