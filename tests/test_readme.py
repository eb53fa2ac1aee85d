"""The README documents every setting the worker reads."""

from __future__ import annotations

from pathlib import Path

from schemas.settings import AttributeNames, Settings

README = (Path(__file__).parent.parent / "README.md").read_text()


def test_every_setting_has_a_row_in_the_configuration_table() -> None:
    names = [name.upper() for name in Settings.model_fields if name != "attributes"]
    names += [f"ATTR_{name.upper()}" for name in AttributeNames.model_fields]
    missing = [name for name in names if f"`{name}`" not in README]
    assert missing == []


def test_the_readme_gives_the_two_commands() -> None:
    assert "./scripts/demo" in README
    assert "./scripts/test" in README
