"""What each example stack costs: a month at rest, a million sessions cleaned, and what stays after it is deleted.

Counted from the template as each example deploys it (``benchmarks.stack``): its KMS keys, alarms (by the metrics
each one watches), dashboard, the backlog mapping's idle polling, the sweeper's schedule, and the worker's custom
metrics while sessions end; functions, log groups, queues and buckets cost nothing at rest. Prices are AWS's published
on-demand prices for us-east-1 (``CHECKED``), before any free tier; the calls a session makes are those of
``CALLS``, from the worker's code and benchmarks/README.md.

``python -m benchmarks.stack_costs`` prints the table docs/lambda.md holds between its ``costs`` markers; ``--check``
exits 1 when that table is not the one the template and these prices make (tests/test_stack_costs.py runs it).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.stack import EXAMPLES, ROOT, Stack

CHECKED = "2026-12, us-east-1"
PAGE = ROOT / "docs" / "lambda.md"
START, END = "<!-- costs:start -->", "<!-- costs:end -->"

KMS_KEY = 1.00  # a month per customer managed key (each rotation of its material adds $1, twice at most)
ALARM_METRIC = 0.10  # a month per metric an alarm watches, standard resolution
DASHBOARD = 3.00  # a month (an account's first three dashboards are free)
CUSTOM_METRIC = 0.30  # a month per metric published every hour
SQS_REQUEST = 0.40 / 1e6
LAMBDA_GB_SECOND = 0.0000133334  # arm64
LAMBDA_REQUEST = 0.20 / 1e6
KMS_REQUEST = 0.03 / 1e4
S3_LIST_OR_POST = 0.005 / 1e3  # ListObjectVersions, and DeleteObjects counted as a POST
DYNAMODB_READ = 0.125 / 1e6  # on-demand read request unit
DYNAMODB_WRITE = 0.625 / 1e6
LOG_GB = 0.50  # CloudWatch Logs ingestion

HOURS = 730  # a month
IDLE_SQS_POLLS = 5 * 3 * 60 * HOURS  # Lambda's five long polls of 20 s on an idle queue
SWEEP_SECONDS, SWEEP_QUERIES = 0.3, 49  # an idle sweep at 512 MB: 48 h of hour buckets
LOG_LINE_BYTES = 700  # the per-record INFO line, with its EMF share
CPU_GB_SECONDS_PER_CALL = 0.0028  # ~4.8 ms of CPU for 3 calls at 1,024 MB (0.58 vCPU): benchmarks/README.md
CALLS = {
    "connection": {"lambda": 1},  # DeleteConnection: API Gateway bills messages and connection minutes, not this
    "grant": {"lambda": 2, "kms": 2},  # ListGrants (the binding) and RetireGrant
    "scratch": {"lambda": 2, "s3": 2},  # ListObjectVersions and DeleteObjects (GetBucketVersioning once a process)
    "registry": {"lambda": 2, "read": 1, "write": 3},  # the index's Query, three memberships' BatchWriteItem
}


@dataclass(frozen=True)
class Costs:
    """One example's costs."""

    example: str
    actions: tuple[str, ...]
    keys: int
    alarm_metrics: int
    alarms: int
    idle_polls: bool
    sweeper: bool
    metrics: int
    retained: tuple[str, ...]

    @property
    def fixed(self) -> float:
        polls = IDLE_SQS_POLLS * SQS_REQUEST if self.idle_polls else 0.0
        sweeps = 0.0
        if self.sweeper:
            one = SWEEP_SECONDS * 0.5 * LAMBDA_GB_SECOND + LAMBDA_REQUEST + SWEEP_QUERIES * DYNAMODB_READ / 2
            sweeps = 60 * HOURS * one  # every minute; an empty Query reads half a unit
        return (
            (self.keys * KMS_KEY + self.alarm_metrics * ALARM_METRIC + DASHBOARD + self.metrics * CUSTOM_METRIC)
            + polls
            + sweeps
        )

    @property
    def per_million(self) -> float:
        calls = {"lambda": 0, "kms": 0, "s3": 0, "read": 1, "write": 0}  # read: the fence's BatchGetItem
        for action in self.actions:
            for kind, count in CALLS.get(action, {}).items():
                calls[kind] += count
        per_session = (
            calls["lambda"] * CPU_GB_SECONDS_PER_CALL * LAMBDA_GB_SECOND
            + LAMBDA_REQUEST / 100  # a batch of 100 records an invocation
            + calls["kms"] * KMS_REQUEST
            + calls["s3"] * S3_LIST_OR_POST
            + calls["read"] * DYNAMODB_READ
            + calls["write"] * DYNAMODB_WRITE
            + LOG_LINE_BYTES / 1e9 * LOG_GB
        )
        return per_session * 1e6


def costs(example: Path) -> Costs:
    stack = Stack.of(example)
    resources = stack.resources()
    alarms = stack.of_type("AWS::CloudWatch::Alarm")
    stats = [[m for m in a["Properties"].get("Metrics", []) if "MetricStat" in m] for a in alarms.values()]
    watched = sum(len(metrics) or 1 for metrics in stats)  # a metric math alarm is billed per metric it reads
    actions = tuple(name for name in ("connection", "grant", "scratch", "registry") if stack.condition(_ON[name]))
    sweeper = "SweeperFunction" in resources
    return Costs(
        example=example.parent.name,
        actions=actions,
        keys=len(stack.of_type("AWS::KMS::Key")),
        alarm_metrics=watched,
        alarms=len(alarms),
        idle_polls="BacklogDrainMapping" in resources,
        sweeper=sweeper,
        metrics=3 + (3 if sweeper else 0),
        retained=tuple(sorted(n for n, r in resources.items() if r.get("DeletionPolicy") == "Retain")),
    )


_ON = {"connection": "ConnectionOn", "grant": "GrantOn", "scratch": "ScratchOn", "registry": "HasRegistry"}


def table() -> str:
    rows = [
        f"Prices: AWS's on-demand prices, {CHECKED}, before any free tier. Fixed: a month with sessions ending every "
        "hour and none failing. A million sessions: each holding what the example's actions free.",
        "",
        "| example | actions | KMS keys | alarms (metrics) | fixed a month | a million sessions | retained on delete |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for found in map(costs, EXAMPLES):
        retained = ", ".join(f"`{name}`" for name in found.retained) or "nothing"
        rows.append(
            f"| `{found.example}` | {', '.join(found.actions)} | {found.keys} | {found.alarms} "
            f"({found.alarm_metrics}) | ${found.fixed:.2f} | ${found.per_million:.2f} | {retained} |"
        )
    return "\n".join(rows) + "\n"


def written() -> str:
    text = PAGE.read_text()
    return text[text.index(START) + len(START) : text.index(END)].strip("\n") + "\n"


def main(argv: list[str]) -> int:
    if argv[1:] == ["--check"]:
        if written() != table():
            print(f"{PAGE}: the costs table is stale; run python -m benchmarks.stack_costs --write", file=sys.stderr)
            return 1
        return 0
    if argv[1:] == ["--write"]:
        text = PAGE.read_text()
        PAGE.write_text(text[: text.index(START) + len(START)] + "\n" + table() + text[text.index(END) :])
        return 0
    print(table(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
