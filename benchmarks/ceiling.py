"""The worker's own costs, against the stub AWS: CPU per session before and after, where it goes, the worker's
ceiling against the latency-only ideal, and the Lambda sizing that follows.

* **CPU before and after**: the same batch through this tree and through an earlier commit checked out beside it
  (``stubbed.earlier_tree``), in turns, each warm in a fresh interpreter with Lambda's logging on; the median of the
  turns is reported.
* **Where it goes**: cProfile of every thread with a CPU clock (``time.thread_time``), shares of the handler's CPU
  by what is done (botocore's request path in parts, the worker's own code).
* **Ceiling**: the same batch at default settings against the stub answering after 20 ms; the ideal is every call
  at 20 ms, MAX_CONCURRENCY at a time, and nothing else (as in section 1).
* **Sizing**: Lambda gives CPU in proportion to memory, one full vCPU at 1,769 MB; a single Python process uses at
  most one (the GIL). Sessions a second = vCPU share / CPU seconds per session, and no more than the ceiling measured
  on a full core.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from benchmarks import stubbed
from benchmarks.stub_aws import StubAws

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
    ("classifying and planning records", r"cleanup/(classify\.py:\d+\(classify|plan\.py:\d+\(plan)\)"),
    ("reporting: outcomes logged and counted", r"cleanup/telemetry\.py:\d+\((log_outcomes|record_outcomes)\)"),
)


SENT_BY_COALESCERS = r"cleanup/aws/coalesce\.py:\d+\(_dispatch\)"


@dataclass
class Comparison:
    before: list[stubbed.Run]
    after: list[stubbed.Run]

    @staticmethod
    def median_cpu(runs: list[stubbed.Run]) -> float:
        return statistics.median(run.cpu_ms_per_session for run in runs)

    @property
    def saving(self) -> float:
        return 1.0 - self.median_cpu(self.after) / self.median_cpu(self.before)


def compare(stub: StubAws, before: Path, sessions: int, turns: int) -> Comparison:
    """CPU per session of ``before`` and of this tree on the same batch size, in turns."""
    result = Comparison([], [])
    for _ in range(turns):
        result.before.append(stubbed.invoke(before, stub, sessions))
        result.after.append(stubbed.invoke(stubbed.ROOT, stub, sessions))
    return result


def profile_shares(stub: StubAws, tree: Path, sessions: int) -> list[tuple[str, float]]:
    """Each part's share of the handler's profiled CPU (cumulative) in ``tree``."""
    stubbed.PROFILE.update(profile_sort="cumulative", profile_lines=10_000)
    try:
        run = stubbed.invoke(tree, stub, sessions, profile=True)
    finally:
        stubbed.PROFILE.clear()
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


def ideal_seconds(run: stubbed.Run, concurrency: int = 32) -> float:
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
