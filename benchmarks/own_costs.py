"""The worker's own costs, against the stub AWS (``stub_aws.py``): CPU per session before and after, where it goes,
the worker's ceiling against the latency-only ideal, and the Lambda sizing that follows.

Each case is a fresh interpreter (``invoke.py``, warm) running the Lambda handler, its settings from the environment
as in Lambda (JSON logs and EMF metrics on stdout, discarded), against a stub that answers from memory after a fixed
latency. Records are synthesised in the exact shape an event source mapping delivers (the same fields as moto's
GetRecords output): REMOVE records of sessions with a connection, a grant and ``objects`` scratch objects. Every case
checks afterwards that exactly its sessions are gone. ``tree`` is the source tree the child imports: this one, or an
earlier commit checked out beside it in a temporary worktree (``earlier_tree``), so that before and after are
measured in the same run by the same code.

* **CPU before and after**: the same batch through both trees, in turns, each warm in a fresh interpreter with
  Lambda's logging on; the median of the turns is reported.
* **Where it goes**: cProfile of every thread with a CPU clock (``time.thread_time``), shares of the handler's CPU
  by what is done (botocore's request path in parts, the worker's own code).
* **Ceiling**: the same batch at default settings against the stub answering after 20 ms; the ideal is every call
  at 20 ms, MAX_CONCURRENCY at a time, and nothing else (as in section 1).
* **Sizing**: Lambda gives CPU in proportion to memory, one full vCPU at 1,769 MB; a single Python process uses at
  most one (the GIL). Sessions a second = vCPU share / CPU seconds per session, and no more than the ceiling measured
  on a full core.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
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
        log_path = os.path.join(scratch, "log.jsonl")
        with open(log_path, "w") as log:
            done = subprocess.run(
                [sys.executable, str(ROOT / "benchmarks" / "invoke.py"), "--warm", spec_path, out_path],
                cwd=tree,
                env=child_env,
                stdout=log,
                stderr=subprocess.PIPE,
                text=True,
            )
        if done.returncode != 0:
            raise RuntimeError(f"invocation in {tree} failed: {done.stderr[-3000:]}")
        with open(out_path) as out:
            report = json.load(out)
        if Path(report["code"]).resolve() != tree.resolve():
            raise AssertionError(f"the child imported the worker from {report['code']}, not {tree}")
        if report["failures"]:  # while the scratch folder, and the handler's logs in it, are still there
            raise AssertionError(
                f"{tree}: {report['failures']} records failed; the handler said:\n{complaints(log_path)}"
            )
    left = stub.control("observe", **spec)
    if any(left.values()):
        raise AssertionError(f"{tree} left resources behind: {left}")
    stub.control("calls")
    return Run(
        str(tree), sessions, report["seconds"], report["cpu_seconds"], report["calls"], report.get("profile", "")
    )


def complaints(log_path: str, most: int = 20) -> str:
    """The last ``most`` lines the handler logged at WARNING or above (its logs are JSON lines on stdout)."""
    lines = []
    with open(log_path) as log:
        for line in log:
            try:
                level = json.loads(line).get("level")
            except (ValueError, AttributeError):
                continue
            if level in ("WARNING", "ERROR", "CRITICAL"):
                lines.append(line.rstrip()[:1000])
    return "\n".join(lines[-most:]) or "(nothing at WARNING or above)"


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


LATENCY = 0.02
FULL_VCPU_MB = 1769
SIZES_MB = (512, 1024, FULL_VCPU_MB)
ARM_PRICE_GB_SECOND = 0.0000133334  # Lambda arm64, us-east-1, per GB-second
# What the handler's CPU is spent on: (name, pattern of the profiled function, as pstats names it). Cumulative
# times, so the parts of botocore's request path overlap "botocore, every API call" rather than adding up to it.
PARTS = (
    ("botocore, every API call", r"botocore/client\.py:\d+\(_make_api_call\)"),
    ("  sending and receiving (urllib3, http.client)", r"botocore/httpsession\.py:\d+\(send\)"),
    ("  SigV4 signing", r"botocore/signers\.py:\d+\(sign\)"),
    ("  serialising and validating the request", r"botocore/client\.py:\d+\(_convert_to_request_dict\)"),
    ("  parsing the answer", r"botocore/parsers\.py:\d+\(parse\)"),
    ("  endpoint rules", r"botocore/client\.py:\d+\(_resolve_endpoint_ruleset\)"),
    ("the worker's pacing hooks", r"cleanup/aws/pacing\.py:\d+\((_before_send|_after_attempt)\)"),
    ("the coalescers' own work (locks, waits, wake-ups)", r"cleanup/aws/coalesce\.py:\d+\(submit\)"),
    ("reading the event into records (pydantic)", r"schemas/records\.py:\d+\(read_lambda_event\)"),
    ("classifying and planning records", r"cleanup/(core/)?(classify\.py:\d+\(classify|plan\.py:\d+\(plan)\)"),
    ("reporting: outcomes logged and counted", r"cleanup/telemetry\.py:\d+\((log_outcomes|record_outcomes)\)"),
)


SENT_BY_COALESCERS = r"cleanup/aws/coalesce\.py:\d+\(_dispatch\)"


@dataclass
class Comparison:
    before: list[Run]
    after: list[Run]

    @staticmethod
    def median_cpu(runs: list[Run]) -> float:
        return statistics.median(run.cpu_ms_per_session for run in runs)

    @property
    def saving(self) -> float:
        return 1.0 - self.median_cpu(self.after) / self.median_cpu(self.before)


def compare(stub: StubAws, before: Path, sessions: int, turns: int) -> Comparison:
    """CPU per session of ``before`` and of this tree on the same batch size, in turns."""
    result = Comparison([], [])
    for _ in range(turns):
        result.before.append(invoke(before, stub, sessions))
        result.after.append(invoke(ROOT, stub, sessions))
    return result


def profile_shares(stub: StubAws, tree: Path, sessions: int) -> list[tuple[str, float]]:
    """Each part's share of the handler's profiled CPU (cumulative) in ``tree``. Under cProfile every Python call costs
    several times more, and on a loaded machine the time from a fence's read to its send passed the 0.25 s the send
    check allows (refused, the record failed, and the benchmark with it): the profiled run allows the setting's most,
    5 s. The shares are of CPU, which the bound does not change; the runs that time the handler keep the default."""
    PROFILE.update(profile_sort="cumulative", profile_lines=10_000)
    try:
        run = invoke(tree, stub, sessions, profile=True, FENCE_READ_MAX_AGE_SECONDS="5")
    finally:
        PROFILE.clear()
    stat = re.compile(r"^\s*[\d/]+\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s+[\d.]+\s+(.+)$")
    cumulative: dict[str, float] = {}
    for line in run.profile.splitlines():
        match = stat.match(line)
        if match:
            cumulative[match[2]] = cumulative.get(match[2], 0.0) + float(match[1])
    total = float(re.search(r"in ([\d.]+) seconds", run.profile).group(1))  # type: ignore[union-attr]  # every thread
    shares = []
    for label, pattern in PARTS:
        seconds = sum(value for name, value in cumulative.items() if re.search(pattern, name))
        if label.startswith("the coalescers"):  # less the requests they send, counted with botocore
            seconds -= sum(value for name, value in cumulative.items() if re.search(SENT_BY_COALESCERS, name))
        shares.append((label, seconds / total))
    return shares


def ideal_seconds(run: Run, concurrency: int = 32) -> float:
    return run.total_calls * LATENCY / concurrency


def sizing(cpu_ms: float, ceiling_per_second: float) -> list[dict[str, float]]:
    """Sessions a second for one invocation at each memory size, and what a million sessions cost there."""
    table = []
    for memory in SIZES_MB:
        vcpu = min(1.0, memory / FULL_VCPU_MB)
        per_second = min(vcpu / (cpu_ms / 1000), ceiling_per_second)
        cost = memory / 1024 * (1_000_000 / per_second) * ARM_PRICE_GB_SECOND
        table.append({"memory": memory, "vcpu": vcpu, "per_second": per_second, "cost": cost})
    return table
