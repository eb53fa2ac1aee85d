"""The command line: every sub-command loads and describes itself."""

from __future__ import annotations

import pytest

from worker.cli import COMMANDS, main


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert f"cleanup-worker {command}" in capsys.readouterr().out


def test_an_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["nonsense"])
    assert exit_.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["replay", "sweep", "run", "check"])
def test_a_bad_setting_is_a_configuration_error_with_exit_2(
    command: str, aws: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # aws: a region, so that the command gets as far as its settings
    monkeypatch.setenv("MAX_CONCURRENCY", "0")
    argv = {"replay": ["replay", "x.json"], "sweep": ["sweep"], "run": ["run", "--table-name", "t"], "check": ["check"]}
    assert main(argv[command]) == 2
    err = capsys.readouterr().err
    assert f"cleanup-worker {command}: configuration error" in err
    assert "max_concurrency" in err
