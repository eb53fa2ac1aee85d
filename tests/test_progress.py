"""Progress of the long commands, through the real CLI: drawn on a terminal, absent from a pipe and with --json."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from benchmarks.replay_memory import write_file
from tests.waiting import WAIT_GUARD_SECONDS

ROOT = Path(__file__).resolve().parent.parent
ENV = {
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9",  # refuses the one call (DescribeTable) and then nothing is a session
    "METRICS_DESTINATION": "off",
    "LOG_LEVEL": "WARNING",
    "SESSION_TABLE": "sessions",  # the records' table: replay refuses a run whose every record is another table's
}


def replay_stderr(path: Path, *options: str, terminal: bool) -> str:
    """Run ``cleanup-worker replay`` with stderr on a pseudo-terminal (or a pipe); what it wrote there."""
    command = [sys.executable, "-m", "worker.cli", "replay", *options, str(path)]
    env = {**os.environ, **ENV}
    if not terminal:
        done = subprocess.run(command, capture_output=True, env=env, cwd=ROOT, timeout=WAIT_GUARD_SECONDS)
        assert done.returncode == 0, done.stderr
        return done.stderr.decode()
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal has a size
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=follower, env=env, cwd=ROOT)
    os.close(follower)
    written = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed its side (EIO)
            break
        if not chunk:
            break
        written += chunk
    os.close(leader)
    assert child.wait(timeout=WAIT_GUARD_SECONDS) == 0, written
    return written.decode(errors="replace")


@pytest.fixture
def records(tmp_path: Path) -> Path:
    path = tmp_path / "records.jsonl"
    write_file(path, 300)
    return path


def test_replay_shows_done_rate_and_eta_on_a_terminal(records: Path) -> None:
    shown = replay_stderr(records, terminal=True)

    assert "replay:" in shown and "B/s" in shown and "<" in shown  # elapsed<remaining, the ETA


def test_replay_shows_nothing_on_a_pipe(records: Path) -> None:
    assert "replay:" not in replay_stderr(records, terminal=False)


def test_replay_shows_nothing_with_json_even_on_a_terminal(records: Path) -> None:
    assert "replay:" not in replay_stderr(records, "--json", terminal=True)
