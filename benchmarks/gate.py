"""What asking the permit where each freeing call leaves costs: calls per session and throughput, before and after.

The same batch (sessions with a connection, a grant and 3 scratch objects; SESSION_BINDING on and off) goes through
the Lambda handler of an earlier commit (the permit asked by each call site, before the pacer's waits) and of this
tree (the permit asked at the send, after every wait, with a bound on the read's age), in turns, each warm in a fresh
interpreter, against the stub AWS answering after 20 ms (``benchmarks.own_costs``). Printed: calls per session by
operation, seconds and sessions a second (medians of the turns), and the ratios after / before.

    python -m benchmarks.gate [--before REV] [--sessions N] [--turns N]
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter

from benchmarks import own_costs as costs
from benchmarks.stub_aws import StubAws

BEFORE = "72fc19a"  # the last commit whose call sites asked their permit before the pacer's waits
LATENCY = 0.02


def measure(before: str, sessions: int, turns: int) -> list[str]:
    """The table's lines, one case a binding setting."""
    lines = [
        f"{sessions} sessions a batch (1 connection, 1 grant, 3 objects each), {turns} turns each, in alternation, "
        f"against the stub AWS at {LATENCY * 1000:.0f} ms a call; before = commit {before}\n",
        "| SESSION_BINDING | code | calls / session | BatchGetItem / session | seconds (median) | sessions/s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    ratios = []
    with StubAws(LATENCY) as stub, costs.earlier_tree(before) as earlier:
        for binding in ("true", "false"):
            runs: dict[str, list[costs.Run]] = {"before": [], "after": []}
            for _ in range(turns):
                for name, tree in (("before", earlier), ("after", costs.ROOT)):
                    runs[name].append(costs.invoke(tree, stub, sessions, SESSION_BINDING=binding))
            figures = {}
            for name, done in runs.items():
                calls = Counter(done[0].calls)
                seconds = statistics.median(run.seconds for run in done)
                figures[name] = (done[0].total_calls / sessions, seconds)
                lines.append(
                    f"| {binding} | {name} | {done[0].total_calls / sessions:.3f} | "
                    f"{calls['BatchGetItem'] / sessions:.3f} | {seconds:.2f} | {sessions / seconds:.0f} |"
                )
            calls_ratio = figures["after"][0] / figures["before"][0]
            speed_ratio = figures["before"][1] / figures["after"][1]
            ratios.append(f"- binding {binding}: calls per session x{calls_ratio:.3f}, throughput x{speed_ratio:.2f}")
    return [*lines, "", *ratios, "", "(target: both within 10% of before: calls x <= 1.10, throughput x >= 0.90)"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=BEFORE)
    parser.add_argument("--sessions", type=int, default=500)
    parser.add_argument("--turns", type=int, default=3)
    arguments = parser.parse_args()
    for line in measure(arguments.before, arguments.sessions, arguments.turns):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
