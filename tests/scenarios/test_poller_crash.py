"""Scenario 2: the stream poller (``cleanup-worker run``) killed with SIGKILL mid-batch, restarted, under faults."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.proxy import KINDS
from tests.scenarios.helpers import World, assert_final_state, new_ids
from tests.waiting import WAIT_GUARD_SECONDS, wait_for

pytestmark = pytest.mark.slow  # a fault scenario

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = 300
GUARD_SECONDS = 4 * WAIT_GUARD_SECONDS  # a hang guard for each poller's part: a loaded machine takes minutes


def poller(world: World, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    """``cleanup-worker run`` in its own process, reaching AWS and the gateway only through the fault proxies."""
    stack = world.stack
    env: dict[str, Any] = {
        **os.environ,
        **stack.aws.environment(),
        "AWS_ENDPOINT_URL": world.aws_proxy.url,
        "SCRATCH_BUCKET": stack.bucket,
        "KMS_KEY_ID": stack.key_arn,
        "SESSION_TABLE": stack.table,
        "WS_CALLBACK_URL": f"{world.gateway_proxy.url}/{world.gateway.stage}",
        "CHECKPOINT_TABLE": f"ckpt-{stack.table}",
        "LEASE_SECONDS": "5",  # the restarted poller takes over the dead one's lease this soon
        "POLL_INTERVAL_SECONDS": "0.1",
        "BATCH_SIZE": "100",
        "BOTOCORE_MAX_ATTEMPTS": "1",
        "RETRY_MAX_WAIT_SECONDS": "0.05",
        "METRICS_DESTINATION": "off",
    }
    command = [sys.executable, "-m", "worker.cli", "run", "--table-name", stack.table, *extra]
    with log.open("a") as stderr:
        return subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)


@pytest.mark.timeout(3 * GUARD_SECONDS)
def test_a_poller_killed_mid_batch_and_restarted_cleans_every_session_exactly(world: World, tmp_path: Path) -> None:
    live = world.make_sessions(new_ids(10, "live"), sockets=2)
    ended = world.make_sessions(new_ids(SESSIONS, "end"), sockets=30)
    kept = world.plant_sentinels()
    world.end(ended)
    # Faults on the cleanup's calls; the poller's own reads, lease and checkpoints (DynamoDB) pass untouched. Only
    # faults the service answers (no delay past a read timeout): with the default timeouts, what is cleaned and when
    # depends on the answers, not on how fast a loaded machine serves them (timeouts have scenarios of their own).
    world.plan.rate, world.plan.rates = 0.2, {"dynamodb": 0.0, "dynamodb:GetItem": 0.2}
    world.plan.kinds = tuple(kind for kind in KINDS if kind != "delay")
    log = tmp_path / "stderr"
    total = len(world.stack.objects())

    first = poller(world, log)
    try:
        # A third of the sessions cleaned: kill it.
        third = total - SESSIONS // 3
        wait_for(
            lambda: len(world.stack.objects()) <= third,
            "a third of the sessions cleaned",
            limit=GUARD_SECONDS,
            alive=first,
            log=log,
        )
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    finally:
        first.kill()
    left_at_kill = len(world.stack.objects()) - len(kept) - len(live)
    second = poller(world, log, "--until-idle")
    try:
        code = second.wait(GUARD_SECONDS)
    finally:
        second.kill()

    world.plan.enabled = False
    assert first.returncode == -signal.SIGKILL
    assert left_at_kill > 0  # the kill did land mid-stream
    assert code == 0, log.read_text()[-3000:]
    assert_final_state(world, deleted=ended, live=live, kept=kept)
    print(f"\npoller: sessions={SESSIONS} left at kill={left_at_kill} injected={dict(world.plan.injected)}")
