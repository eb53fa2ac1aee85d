"""Start-up refusals: a library below its declared floor, a missing extra, and ``--version``.

Each runs the real entry point in a child interpreter. An older library is simulated the way a Lambda layer or a
pre-installed package shadows ours: a ``<name>-<version>.dist-info`` earlier on ``sys.path``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from worker.floors import floors, release

ROOT = Path(__file__).resolve().parents[1]
EVENT = ROOT / "tests" / "events" / "dynamodb-streams-lambda-event.json"


def run(code: str, shadow: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(shadow) if shadow else ""}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture
def old_tenacity(tmp_path: Path) -> Path:
    """A directory whose metadata says tenacity 8.2.0 is installed (below the 8.3 floor)."""
    info = tmp_path / "tenacity-8.2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tenacity\nVersion: 8.2.0\n")
    return tmp_path


def test_the_declared_floors_are_read_from_the_installed_metadata() -> None:
    found = floors(["local"])
    assert release(found["botocore"]) >= (1, 43, 68)
    assert release(found["tenacity"]) >= (8, 3)
    assert release(found["aiohttp"]) >= (3, 11)
    assert "kclpy-ext" not in found  # another extra's


@pytest.mark.parametrize(
    ("version", "expected"),
    [("1.43.68", (1, 43, 68)), ("3.1.3.post4", (3, 1, 3)), ("2.0rc1", (2,)), ("8.3.0", (8, 3)), ("2026.1", (2026, 1))],
)
def test_release_is_the_numeric_part_without_trailing_zeros(version: str, expected: tuple[int, ...]) -> None:
    assert release(version) == expected


def test_the_cli_refuses_an_old_library_with_one_line_and_exit_2(old_tenacity: Path) -> None:
    result = run("import sys; from worker.cli import main; sys.exit(main(['sweep']))", shadow=old_tenacity)
    assert result.returncode == 2
    floor = floors()["tenacity"]
    assert result.stderr.splitlines() == [
        f"cleanup-worker sweep: tenacity 8.2.0 is installed, but session-cleanup-worker needs tenacity>={floor}"
    ]


def test_the_lambda_handler_fails_the_whole_batch_untouched_with_one_error_line(old_tenacity: Path) -> None:
    code = (
        "import json, pathlib; from worker.lambda_handler import handler; "
        f"print(json.dumps(handler(json.loads(pathlib.Path({str(EVENT)!r}).read_text()), None)))"
    )
    result = run(code, shadow=old_tenacity)
    assert result.returncode == 0, result.stderr
    numbers = [r["dynamodb"]["SequenceNumber"] for r in json.loads(EVENT.read_text())["Records"]]
    assert json.loads(result.stdout) == {"batchItemFailures": [{"itemIdentifier": n} for n in numbers]}
    assert len(result.stderr.splitlines()) == 1
    assert "tenacity 8.2.0 is installed" in result.stderr


def test_the_sweep_handler_refuses_with_one_error_line(old_tenacity: Path) -> None:
    result = run("import json; from worker.sweep import handler; print(json.dumps(handler({}, None)))", old_tenacity)
    assert result.returncode == 0, result.stderr
    assert "tenacity 8.2.0 is installed" in json.loads(result.stdout)["refused"]
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize(("command", "module", "extra"), [("demo", "aiohttp", "local"), ("kcl", "amazon_kclpy", "kcl")])
def test_a_missing_extra_names_the_install_that_provides_it(command: str, module: str, extra: str) -> None:
    result = run(
        f"import sys; sys.modules[{module!r}] = None; from worker.cli import main; sys.exit(main([{command!r}]))"
    )
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith(f"cleanup-worker {command}: needs the [{extra}] extra")
    assert f"pip install '.[{extra}]' in the project's clone" in line  # no index holds the project


def test_version_prints_the_installed_version() -> None:
    result = run("from worker.cli import main; main(['--version'])")
    assert result.stdout.strip() == f"cleanup-worker {metadata.version('session-cleanup-worker')}"
