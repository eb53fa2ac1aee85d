"""The code keeps the project's standards: ruff (lint, complexity, format) and mypy strict on the packages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing_to_fix() -> None:
    pytest.importorskip("ruff")
    lint = run(sys.executable, "-m", "ruff", "check", ".")
    assert lint.returncode == 0, lint.stdout
    formatting = run(sys.executable, "-m", "ruff", "format", "--check", ".")
    assert formatting.returncode == 0, formatting.stdout


def test_mypy_strict_passes_on_the_packages() -> None:
    pytest.importorskip("mypy")
    result = run(sys.executable, "-m", "mypy")
    assert result.returncode == 0, result.stdout


MISSPELT = """
from cleanup.aws.calls import call, call_or_gone
from cleanup.aws.clients import Clients


def close(clients: Clients) -> None:
    call(clients.kms.retire_grant, "RetireGrant", None, KeyID="key", GrantId="grant")
    call_or_gone(clients.management("https://x").delete_connection, "DeleteConnection", None, (), Connection="c")
    clients.s3.list_objects_v2(Bucket="b", Prefix=1)
"""


def test_mypy_finds_a_misspelt_or_mistyped_boto3_keyword(tmp_path: Path) -> None:
    # The AWS edge is typed: the clients by the boto3 stubs, and ``call`` by the method it wraps.
    pytest.importorskip("mypy")
    module = tmp_path / "misspelt.py"
    module.write_text(MISSPELT)
    result = run(sys.executable, "-m", "mypy", "--strict", str(module))
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert any('misspelt.py:7: error: Unexpected keyword argument "KeyID"' in line for line in errors), result.stdout
    assert any('misspelt.py:8: error: Unexpected keyword argument "Connection"' in line for line in errors), errors
    assert any('misspelt.py:9: error: Argument "Prefix"' in line for line in errors), errors
    assert len(errors) == 3, errors
