"""The layers hold: import-linter's contracts ([tool.importlinter] in pyproject.toml) are kept, break on an import that
goes up or sideways, and docs/decides.md's Layout table names the same layers and every module of each part."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGES = ("worker", "cleanup", "schemas")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(where: Path) -> subprocess.CompletedProcess[str]:
    if not LINT_IMPORTS.exists():
        pytest.skip("import-linter is not installed (the test extra brings it)")
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=where, capture_output=True, text=True, timeout=300, check=False
    )


def test_the_import_contracts_are_kept() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 2 kept, 0 broken." in result.stdout, result.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # Up: the AWS layer importing the core.
        (
            "cleanup/aws/calls.py",
            "from cleanup.core.pipeline import process_batch",
            "cleanup.aws.calls -> cleanup.core",
        ),
        # Sideways: a part importing its sibling on the same layer.
        ("cleanup/expiry/sweeper.py", "from cleanup.queues import backlog", "cleanup.expiry.sweeper -> cleanup.queues"),
        # Up, across packages: data importing the cleanup package.
        ("schemas/session.py", "from cleanup import exceptions", "schemas.session -> cleanup.exceptions"),
        # Up, under TYPE_CHECKING too: the core importing the runtime for its types.
        (
            "cleanup/core/plan.py",
            "import typing\nif typing.TYPE_CHECKING:\n    from cleanup.runtime import Runtime",
            "cleanup.core.plan -> cleanup.runtime",
        ),
    ],
)
def test_an_import_against_the_layers_breaks_the_contract(tmp_path: Path, module: str, line: str, broken: str) -> None:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    source = tmp_path / module
    source.write_text(source.read_text() + "\n" + line + "\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0, result.stdout
    assert "1 broken" in result.stdout, result.stdout
    assert broken in result.stdout, result.stdout


def contract() -> list[tuple[int, str]]:
    """The layers as the contracts state them, top to bottom: (layer number, part)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts = {c["id"]: c for c in config["contracts"]}
    packages = contracts["packages"]["layers"]
    assert packages == list(PACKAGES)
    rows = [(1, "worker")]
    for number, layer in enumerate(contracts["cleanup"]["layers"], start=2):
        rows.extend((number, f"cleanup.{part.strip()}") for part in layer.split("|"))
    rows.append((rows[-1][0] + 1, "schemas"))
    return rows


def layout() -> list[tuple[int, str, set[str]]]:
    """docs/decides.md's Layout table: (layer, part, modules named)."""
    text = (ROOT / "docs" / "decides.md").read_text()
    section = text[text.index("## Layout") :]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].isdigit():
            rows.append((int(cells[0]), cells[1].strip("`"), set(re.findall(r"`([a-z0-9_]+)`", cells[3]))))
    return rows


def modules(part: str) -> set[str]:
    """The modules and sub-packages of a part that is a package (none for a module)."""
    where = ROOT.joinpath(*part.split("."))
    if not where.is_dir():
        return set()
    found = {path.stem for path in where.glob("*.py") if path.stem != "__init__"}
    return found | {path.name for path in where.iterdir() if (path / "__init__.py").exists()}


def test_the_layout_table_names_the_contract_s_layers_in_order() -> None:
    assert [(number, part) for number, part, _ in layout()] == contract()


def test_the_layout_table_names_every_module_of_each_part() -> None:
    for _, part, named in layout():
        assert named == modules(part), part
