"""The docs site builds with no warning, and its Reference pages are made from the code and fresh."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from cleanup.telemetry import METRICS

ROOT = Path(__file__).resolve().parents[1]


def test_the_reference_pages_are_made_from_the_current_code() -> None:
    check = subprocess.run(
        [sys.executable, "scripts/reference", "check"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )

    assert check.returncode == 0, check.stderr


def test_every_metric_the_code_emits_is_in_the_reference() -> None:
    emitted: set[str] = set()
    for path in [*ROOT.glob("cleanup/**/*.py"), *ROOT.glob("worker/**/*.py")]:
        text = path.read_text()
        emitted |= set(re.findall(r"\.(?:count|observe)\(\s*\"([A-Za-z]+)\"", text))
        emitted |= set(re.findall(r"\"(Reconcile[A-Z][a-z]+)\"", text))

    assert emitted, "the scan found no metric: its pattern no longer matches the code"
    assert emitted - {metric.name for metric in METRICS} == set()


def test_the_site_builds_strict_every_page_in_the_nav_every_link_and_anchor_found(tmp_path: Path) -> None:
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )

    assert build.returncode == 0, build.stderr
