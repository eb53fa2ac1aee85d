"""The README's main job: the demo runs end to end on its own local stack and finds every session clean."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.slow  # the whole demo, in a process of its own
def test_the_demo_cleans_every_ended_session_and_leaves_live_ones_alone() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    result = subprocess.run(
        [sys.executable, "-m", "worker.cli", "demo", "--objects", "5"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert "10/10 ended sessions cleaned, 2 live sessions untouched, 0 problems" in result.stdout
    assert "room registry: 30 memberships of closed connections removed, 6 of live ones kept" in result.stdout
    assert "[demo] stream poller" in result.stderr
