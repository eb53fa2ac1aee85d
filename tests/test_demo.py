"""The README's main job: the demo runs end to end on its own local stack and finds every session clean."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cleanup.expiry.sweeper import SweepReport, Verdict
from cleanup.streams.shard_state import PollSummary
from worker.demo import poll_line, sweep_line


@pytest.mark.slow  # the whole demo, in a process of its own
def test_the_demo_cleans_every_ended_session_and_leaves_live_ones_alone() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    try:
        result = subprocess.run(
            [sys.executable, "-m", "worker.cli", "demo", "--objects", "5"],
            capture_output=True,
            text=True,
            timeout=120,  # a hang guard: 11 s on the idle 2-core machine, 19 s beside eight busy processes
            env=env,
        )
    except subprocess.TimeoutExpired as hung:  # where it stopped: every line it wrote, not a cut repr
        output = (hung.stderr or b"").decode(errors="replace") if isinstance(hung.stderr, bytes) else hung.stderr
        pytest.fail(f"the demo did not end in {hung.timeout} s; it wrote:\n{output}")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "10/10 ended sessions cleaned, 2 live sessions untouched, 0 problems" in result.stdout
    assert "room registry: 30 memberships of closed connections removed, 6 of live ones kept" in result.stdout
    assert "[demo] stream poller" in result.stderr
    demo_lines = [line for line in result.stderr.splitlines() if line.startswith("[demo]")]
    assert not [line for line in demo_lines if "PollSummary(" in line or "{'" in line or '{"' in line]
    assert any(line.startswith("[demo] sweeper: 3 expired sessions found in") for line in demo_lines)


def test_the_demos_sweeper_and_poller_lines_are_sentences_not_python_values() -> None:
    report = SweepReport(buckets=49)
    report.verdicts.update({Verdict.SWEPT: 3})
    summary = PollSummary(records=24, cleaned=10, skipped=14, checkpoints={"shardId-1": "99"})

    assert sweep_line(report.summary()) == "3 expired sessions found in 49 expiry buckets (3 swept)"
    assert poll_line(summary.as_dict()) == (
        "24 records read: 10 cleaned, 14 skipped, 0 failed attempts, 0 dead-lettered; checkpoints on 1 shard"
    )


@pytest.mark.slow  # the whole preset, in a process of its own
def test_the_connection_table_preset_closes_every_ended_connection_and_keeps_live_rows() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    result = subprocess.run(
        [sys.executable, "-m", "worker.cli", "demo", "--preset", "connection-table"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert "7/7 ended connections' sockets closed, 2 live connections untouched, 0 problems" in result.stdout
    assert "[demo] sweeper: 2 expired sessions found in" in result.stderr
    live = [line for line in result.stdout.splitlines() if line.startswith("conn#") and " live " in line]
    assert len(live) == 2 and all(line.split()[3:6] == ["open", "3", "yes"] for line in live)
