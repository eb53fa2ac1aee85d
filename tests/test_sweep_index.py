"""The sweeper only where it can work: it needs EXPIRY_INDEX, and the table must have that index."""

from __future__ import annotations

import argparse

import pytest

from tests.stack import SessionStack
from tests.test_check import add_backstop
from tests.test_check import run as run_check
from tests.test_sessions import add_expiry_index
from worker import sweep as sweep_entry


def sweep_command(stack: SessionStack, monkeypatch: pytest.MonkeyPatch, **env: str) -> int:
    for name, value in {"SESSION_TABLE": stack.table, "METRICS_DESTINATION": "off", **env}.items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    sweep_entry.add_arguments(parser)
    return sweep_entry.main(parser.parse_args([]))


def test_without_expiry_index_the_sweep_refuses_in_one_line_with_the_fix(
    stack: SessionStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("EXPIRY_INDEX", raising=False)

    code = sweep_command(stack, monkeypatch)

    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("cleanup-worker sweep:")]
    assert code == 2
    assert len(errors) == 1 and "set EXPIRY_INDEX" in errors[0]


def test_a_table_without_the_index_stops_the_sweep_with_one_line_and_exit_2(
    stack: SessionStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code = sweep_command(stack, monkeypatch, EXPIRY_INDEX="expiry-index")

    err = capsys.readouterr().err
    assert code == 2
    [line] = [line for line in err.splitlines() if "expiry-index" in line]
    assert line.startswith("cleanup-worker sweep:") and "has no index 'expiry-index'" in line
    assert "sort key 'ttl'" in line


def test_with_the_index_the_sweep_runs(
    stack: SessionStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    add_expiry_index(stack)

    assert sweep_command(stack, monkeypatch, EXPIRY_INDEX="expiry-index") == 0
    assert '"failedBuckets": 0' in capsys.readouterr().out


def test_check_names_a_missing_expiry_index_with_its_fix(
    stack: SessionStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    add_backstop(stack)
    monkeypatch.setenv("EXPIRY_INDEX", "expiry-index")

    code, lines = run_check(stack, capsys)

    assert code == 2  # a configuration to fix
    [line] = [line for line in lines if line.startswith("FAIL")]
    assert "has no index 'expiry-index'" in line and "partition key 'expiryBucket'" in line


def test_check_passes_the_expiry_index_once_it_exists(
    stack: SessionStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    add_backstop(stack)
    add_expiry_index(stack)
    monkeypatch.setenv("EXPIRY_INDEX", "expiry-index")

    code, lines = run_check(stack, capsys)

    assert code == 0 and any(line.startswith("ok   sweeper's expiry index") for line in lines)
