"""The code keeps the project's standards: ruff (lint, complexity, format) and mypy strict on the packages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


MYPY_SECONDS = 600  # mypy's cold start (no cache, a fresh venv) beside the other CI tiers on two cores took over 120 s


def run(*command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_ruff_finds_nothing_to_fix() -> None:
    pytest.importorskip("ruff")
    lint = run(sys.executable, "-m", "ruff", "check", ".")
    assert lint.returncode == 0, lint.stdout
    formatting = run(sys.executable, "-m", "ruff", "format", "--check", ".")
    assert formatting.returncode == 0, formatting.stdout


@pytest.mark.timeout(MYPY_SECONDS + 60)
def test_mypy_strict_passes_on_the_packages() -> None:
    pytest.importorskip("mypy")
    result = run(sys.executable, "-m", "mypy", timeout=MYPY_SECONDS)
    assert result.returncode == 0, result.stdout


MISSPELT = """
from cleanup.aws.calls import call, call_or_gone
from cleanup.aws.clients import Clients


def close(clients: Clients) -> None:
    call(clients.kms.retire_grant, "RetireGrant", None, KeyID="key", GrantId="grant")
    call_or_gone(clients.management("https://x").delete_connection, "DeleteConnection", None, (), Connection="c")
    clients.s3.list_objects_v2(Bucket="b", Prefix=1)
"""


@pytest.mark.timeout(MYPY_SECONDS + 60)
def test_mypy_finds_a_misspelt_or_mistyped_boto3_keyword(tmp_path: Path) -> None:
    # The AWS edge is typed: the clients by the boto3 stubs, and ``call`` by the method it wraps.
    pytest.importorskip("mypy")
    module = tmp_path / "misspelt.py"
    module.write_text(MISSPELT)
    result = run(sys.executable, "-m", "mypy", "--strict", str(module), timeout=MYPY_SECONDS)
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert any('misspelt.py:7: error: Unexpected keyword argument "KeyID"' in line for line in errors), result.stdout
    assert any('misspelt.py:8: error: Unexpected keyword argument "Connection"' in line for line in errors), errors
    assert any('misspelt.py:9: error: Argument "Prefix"' in line for line in errors), errors
    assert len(errors) == 3, errors
