"""CHANGELOG.md follows Keep a Changelog, and its newest release is the version the command prints."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from worker import cli

ROOT = Path(__file__).resolve().parents[1]
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", re.M)


def test_the_newest_release_in_the_changelog_is_the_projects_version() -> None:
    releases = RELEASE.findall((ROOT / "CHANGELOG.md").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

    assert releases, "no '## [x.y.z] - YYYY-MM-DD' release heading"
    assert releases[0][0] == version
    assert cli.version() in (version, "unknown")  # the installed distribution's, where it is installed


def test_releases_are_newest_first_and_use_the_changelogs_sections() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    versions = [tuple(map(int, v.split("."))) for v, _ in RELEASE.findall(text)]
    sections = set(re.findall(r"^### (\w+)$", text, re.M))

    assert versions == sorted(versions, reverse=True)
    assert sections <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
