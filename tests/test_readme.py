"""The README is short and gives the two commands; every setting the worker reads is in the docs' Reference."""

from __future__ import annotations

import re
from pathlib import Path

from schemas.settings import AttributeNames, Settings

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
SETTINGS_PAGE = (ROOT / "docs" / "reference" / "settings.md").read_text()


def test_every_setting_is_in_the_settings_reference() -> None:
    names = [name.upper() for name in Settings.model_fields if name != "attributes"]
    names += [f"ATTR_{name.upper()}" for name in AttributeNames.model_fields]
    missing = [name for name in names if f"`{name}`" not in SETTINGS_PAGE]
    assert missing == []


def test_the_readme_gives_the_two_commands() -> None:
    assert "./scripts/demo" in README
    assert "./scripts/test" in README


def test_the_readme_is_under_250_lines() -> None:
    assert len(README.splitlines()) < 250


def test_the_readmes_links_into_the_docs_name_pages_that_exist() -> None:
    targets = re.findall(r"\]\((docs/[^)#]+)", README)

    assert targets, "the README links into no docs page"
    assert [target for target in targets if not (ROOT / target).is_file()] == []
