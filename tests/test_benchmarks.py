"""``python -m benchmarks``: one entry point that lists the benchmarks and runs one by name, or the whole suite."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(120)


def benchmarks(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *arguments], cwd=ROOT, capture_output=True, text=True, timeout=100
    )


def test_list_names_each_benchmark_with_its_purpose() -> None:
    listed = benchmarks("list")

    assert listed.returncode == 0, listed.stderr
    rows = dict(line.split(None, 1) for line in listed.stdout.splitlines() if line.strip())
    assert {"suite", "capacity", "quota", "pacing", "mass-expiry", "replay-memory", "integrity", "soak"} <= set(rows)
    assert all(purpose.strip() for purpose in rows.values())


def test_every_listed_benchmark_is_a_module_that_runs_as_a_command() -> None:
    from benchmarks.__main__ import CATALOGUE

    for entry in CATALOGUE:
        spec = importlib.util.find_spec(entry.module)
        assert spec is not None and spec.origin is not None, entry.module
        assert 'if __name__ == "__main__":' in Path(spec.origin).read_text(), entry.module


def test_run_by_name_prints_what_the_module_prints() -> None:
    by_name = benchmarks("run", "capacity", "--sessions", "20000", "--backlog")
    direct = subprocess.run(
        [sys.executable, "-m", "benchmarks.capacity", "--sessions", "20000", "--backlog"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
    )

    assert by_name.returncode == 0, by_name.stderr
    assert by_name.stdout == direct.stdout
    assert "| this deployment | 20,000 |" in by_name.stdout


def test_an_unknown_name_is_refused_in_one_line_naming_the_known_ones() -> None:
    refused = benchmarks("run", "no-such-benchmark")

    assert refused.returncode == 2
    assert refused.stdout == ""
    assert len(refused.stderr.strip().splitlines()) == 1
    assert "no-such-benchmark" in refused.stderr and "capacity" in refused.stderr


def test_the_quota_table_says_when_its_sizes_are_below_those_the_targets_are_stated_for() -> None:
    from benchmarks.quota import TARGET_SESSIONS, Paced, table

    small = table([Paced("one batch", 40, 5.0, 40, 8, 4.95, True), Paced("mass expiry", 30, 3.0, 30, 8, 2.5, True)])
    full = table([Paced("one batch", TARGET_SESSIONS, 5.0, 200, 20, 4.9, True)])

    assert small[-1].endswith(
        f"NOT met (the targets are stated for {TARGET_SESSIONS} sessions a case: at these sizes, for information)"
    )
    assert full[-1].endswith("clean: met")
