"""The worker against the stub AWS (``stub_aws.py``): its own CPU per session, before and after, and its ceiling.

Each case is a fresh interpreter (``stub_invoke.py``) running the Lambda handler warm, its settings from the
environment as in Lambda (JSON logs and EMF metrics on stdout, discarded), against a stub that answers from memory
after a fixed latency. Records are synthesised in the exact shape an event source mapping delivers (the same fields
as moto's GetRecords output): REMOVE records of sessions with a connection, a grant and ``objects`` scratch objects.
Every case checks afterwards that exactly its sessions are gone.

``tree`` is the source tree the child imports: this one, or an earlier commit checked out beside it in a temporary
worktree (``earlier_tree``), so that before and after are measured in the same run by the same code.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.stub_aws import StubAws

ROOT = Path(__file__).resolve().parent.parent
REGION = "us-east-1"
KEY_ARN = f"arn:aws:kms:{REGION}:123456789012:key/00000000-0000-0000-0000-000000000000"
WARM = 32
PROFILE: dict[str, Any] = {}


@dataclass
class Run:
    """One measured invocation."""

    tree: str
    sessions: int
    seconds: float
    cpu_seconds: float
    calls: dict[str, int] = field(default_factory=dict)
    profile: str = ""

    @property
    def cpu_ms_per_session(self) -> float:
        return self.cpu_seconds * 1000 / self.sessions

    @property
    def per_second(self) -> float:
        return self.sessions / self.seconds

    @property
    def total_calls(self) -> int:
        return sum(n for op, n in self.calls.items() if op != "GetBucketVersioning")


def synthesise(count: int, *, objects: int, table: str, bucket: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Lambda event of ``count`` REMOVE records, and what the stub must hold for them."""
    run = uuid.uuid4().hex[:8]
    stream = f"arn:aws:dynamodb:{REGION}:123456789012:table/{table}/stream/2024-01-01T00:00:00.000"
    records, prefixes, grants, connections = [], [], [], []
    for n in range(count):
        sid, tenant = f"{run}-{n}", f"t{n % 7}"
        prefix, grant, connection = f"sessions/{tenant}/{sid}/", f"{run}{n:056d}", f"C{run}{n:06d}="
        keys = {"pk": {"S": f"session#{sid}"}, "sk": {"S": "meta"}}
        image = {
            **keys,
            "tenantId": {"S": tenant},
            "scratchPrefix": {"S": prefix},
            "grantId": {"S": grant},
            "connectionId": {"S": connection},
            "ttl": {"N": "1700000000"},
        }
        records.append(
            {
                "eventID": uuid.uuid4().hex,
                "eventName": "REMOVE",
                "eventVersion": "1.1",
                "eventSource": "aws:dynamodb",
                "awsRegion": REGION,
                "dynamodb": {
                    "ApproximateCreationDateTime": 1700000100.0,
                    "Keys": keys,
                    "OldImage": image,
                    "SequenceNumber": f"{10**20 + n:021d}",
                    "SizeBytes": 220,
                    "StreamViewType": "NEW_AND_OLD_IMAGES",
                },
                "eventSourceARN": stream,
            }
        )
        prefixes.append(prefix)
        grants.append(grant)
        connections.append(connection)
    spec = {"bucket": bucket, "prefixes": prefixes, "objects": objects, "grants": grants, "connections": connections}
    spec["grant_names"] = {
        grant: f"session:{prefix.rstrip('/').rsplit('/', 1)[1]}" for grant, prefix in zip(grants, prefixes, strict=True)
    }
    return {"Records": records}, spec


def invoke(tree: Path, stub: StubAws, sessions: int, *, objects: int = 3, profile: bool = False, **env: str) -> Run:
    """The handler of ``tree`` over ``sessions`` fresh sessions (after a warm-up event of WARM others)."""
    name = uuid.uuid4().hex[:8]
    table, bucket = f"sessions-{name}", f"scratch-{name}"
    event, spec = synthesise(sessions, objects=objects, table=table, bucket=bucket)
    warm, warm_spec = synthesise(WARM, objects=objects, table=table, bucket=bucket)
    for held in (spec, warm_spec):
        stub.control("populate", **held)
    environment = {
        "AWS_ENDPOINT_URL": stub.url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_LAMBDA_FUNCTION_NAME": "session-cleanup",  # logs and metrics to stdout, as in Lambda
        "SCRATCH_BUCKET": bucket,
        "KMS_KEY_ID": KEY_ARN,
        "SESSION_TABLE": table,
        "WS_CALLBACK_URL": f"{stub.url}/prod",
        **env,
    }
    with tempfile.TemporaryDirectory() as scratch:
        spec_path, out_path = os.path.join(scratch, "spec.json"), os.path.join(scratch, "out.json")
        with open(spec_path, "w") as spec_file:
            json.dump({"env": environment, "event": event, "warm": warm, "profile": profile, **PROFILE}, spec_file)
        child_env = {**os.environ, "PYTHONPATH": str(tree)}
        done = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "stub_invoke.py"), spec_path, out_path],
            cwd=tree,
            env=child_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"invocation in {tree} failed: {done.stderr[-3000:]}")
        with open(out_path) as out:
            report = json.load(out)
    if Path(report["code"]).resolve() != tree.resolve():
        raise AssertionError(f"the child imported the worker from {report['code']}, not {tree}")
    if report["failures"]:
        raise AssertionError(f"{tree}: {report['failures']} records failed")
    left = stub.control("observe", **spec)
    if any(left.values()):
        raise AssertionError(f"{tree} left resources behind: {left}")
    stub.control("calls")
    return Run(
        str(tree), sessions, report["seconds"], report["cpu_seconds"], report["calls"], report.get("profile", "")
    )


@contextlib.contextmanager
def earlier_tree(revision: str) -> Iterator[Path]:
    """``revision`` checked out in a temporary worktree beside this one (removed afterwards)."""
    path = Path(tempfile.mkdtemp(prefix="cleanup-before-"))
    path.rmdir()
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(path), revision], cwd=ROOT, check=True, capture_output=True
    )
    try:
        yield path
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, check=False, capture_output=True)
