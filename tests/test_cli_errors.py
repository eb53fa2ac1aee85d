"""Every command, given wrong input, says so in one line with a documented exit code: never a traceback, never a
silent success (2: usage or configuration; 1: it ran and failed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.stack import SessionStack, client
from worker import cli

ALL = list(cli.COMMANDS)
# The arguments each command needs to get as far as AWS.
NEEDS = {
    "run": ["--table-name", "t"],
    "replay": ["x.json"],
    "capture": ["--table-name", "t", "--out", "x.jsonl"],
    "redrive": ["--queue-url", "https://sqs.us-east-1.amazonaws.com/123456789012/q"],
    "retag": ["--queue-url", "https://sqs.us-east-1.amazonaws.com/123456789012/q"],
    "switch": ["status"],
}
CALLS_AWS = [name for name in ALL if name not in ("demo", "health")]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """The exit code and what stderr says beyond a service's ordinary INFO log lines (``run`` and ``drain`` are
    services: their JSON logs are their output; an error among them is one JSON line)."""
    code = cli.main(argv)
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip() and '"level": "INFO"' not in line]
    assert "Traceback" not in captured.err + captured.out
    return code, lines


@pytest.fixture
def settings_env(worker_env: SessionStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SessionStack:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HEALTH_FILE", str(tmp_path / "health"))
    return worker_env


@pytest.mark.parametrize("command", ALL)
def test_an_unknown_flag_is_one_line_naming_the_command_and_exit_2(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = run([command, *NEEDS.get(command, []), "--no-such-flag"], capsys)

    assert code == 2
    assert lines == [
        f"cleanup-worker {command}: unrecognized arguments: --no-such-flag (see cleanup-worker {command} --help)"
    ]


@pytest.mark.parametrize("command", CALLS_AWS)
def test_a_missing_region_is_one_line_with_the_fix_and_exit_2(
    command: str, settings_env: SessionStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)

    code, lines = run([command, *NEEDS.get(command, [])], capsys)

    assert code == 2
    assert lines == [
        f"cleanup-worker {command}: no AWS region: pass --region or set AWS_REGION (e.g. --region eu-west-1)"
    ]


def test_aws_region_alone_is_honoured_outside_lambda(
    settings_env: SessionStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)

    code, lines = run(["sweep", "--table-name", settings_env.table], capsys)

    assert code == 2 and len(lines) == 1  # past the region: it stops at the sweeper's missing EXPIRY_INDEX instead
    assert "EXPIRY_INDEX" in lines[0]


def test_region_flag_reaches_the_calls(
    settings_env: SessionStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)

    code, lines = run(["check", "--region", "us-east-1", "--table-name", settings_env.table], capsys)

    out = capsys.readouterr().out
    assert code in (0, 1, 2) and lines[-1].endswith("failed")  # it reached the checks
    assert "no AWS region" not in "\n".join(lines) + out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["replay", "missing.json"], "missing.json"),
        (["capture", "--table-name", "t", "--out", "no/such/folder/x.jsonl"], "no folder 'no/such/folder'"),
    ],
)
def test_a_missing_file_or_folder_is_one_line_and_exit_2(
    argv: list[str], says: str, settings_env: SessionStack, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = run(argv, capsys)

    assert code == 2
    assert len(lines) == 1 and says in lines[0] and lines[0].startswith(f"cleanup-worker {argv[0]}:")


def test_an_empty_replay_file_is_one_line_and_exit_2(
    settings_env: SessionStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty.jsonl").write_text("")

    code, lines = run(["replay", "empty.jsonl"], capsys)

    assert code == 2
    assert lines == ["cleanup-worker replay: no records in empty.jsonl: nothing to replay"]


def test_drain_without_a_queue_is_one_line_and_exit_2(
    settings_env: SessionStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("BACKLOG_QUEUE_URL", raising=False)

    code, lines = run(["drain", "--until-idle"], capsys)

    assert code == 2
    assert lines == ["cleanup-worker drain: no backlog queue: set BACKLOG_QUEUE_URL or give --queue-url"]


def test_drain_of_a_queue_that_does_not_exist_is_one_line_and_exit_2(
    settings_env: SessionStack, capsys: pytest.CaptureFixture[str]
) -> None:
    real = client("sqs").create_queue(QueueName=f"exists-{settings_env.table}")["QueueUrl"]
    missing = real.replace("exists-", "missing-")

    code, lines = run(["drain", "--until-idle", "--queue-url", missing], capsys)

    assert code == 2
    assert len(lines) == 1 and "no such queue" in lines[0] and missing in lines[0]


@pytest.mark.parametrize("command", ["run", "capture", "status"])
def test_an_unknown_table_is_one_line_and_exit_2(
    command: str, settings_env: SessionStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [command, "--table-name", "no-such-table", *(["--out", "x.jsonl"] if command == "capture" else [])]

    code, lines = run(argv, capsys)

    assert code == 2
    assert len(lines) == 1 and "no-such-table" in lines[0]


def test_kcl_help_needs_no_extra(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["kcl", "--help"])

    assert done.value.code == 0
    assert "examples:" in capsys.readouterr().out


@pytest.mark.parametrize("command", ALL)
def test_every_help_ends_with_examples(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])

    help_text = capsys.readouterr().out
    examples = help_text.split("examples:\n", 1)[1].splitlines()
    assert 1 <= len(examples) <= 3 and all(
        line.strip().startswith(("cleanup-worker", "java", "EXPIRY")) for line in examples
    )


def test_sweep_table_keeps_working_for_a_release_with_a_notice(
    settings_env: SessionStack, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = run(["sweep", "--table", settings_env.table], capsys)

    assert lines[0] == "cleanup-worker sweep: --table is deprecated: use --table-name"
    assert code == 2 and "EXPIRY_INDEX" in lines[1]  # the table was taken: it stopped at the sweeper's own need


def test_check_exits_1_when_it_cannot_ask_aws_and_2_when_the_account_disagrees(
    settings_env: SessionStack, capsys: pytest.CaptureFixture[str]
) -> None:
    """2 is a configuration to fix; 1 is a check that never got an answer (here: nothing listens on the port)."""
    unreachable, _ = run(["check", "--endpoint-url", "http://127.0.0.1:9", "--table-name", "t"], capsys)
    disagrees, lines = run(["check", "--table-name", f"{settings_env.table}-missing"], capsys)

    assert unreachable == 1
    assert disagrees == 2 and lines[-1].endswith("failed")
