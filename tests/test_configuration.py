"""A bad setting ends every entry point the same way: one line naming the variable and why, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cleanup.exceptions import ConfigurationError
from tests.stack import SessionStack
from worker import cli, lambda_handler, sweep
from worker.local.backend import create_session_table

ROOT = Path(__file__).resolve().parent.parent
STREAM = "arn:aws:dynamodb:us-east-1:123456789012:table/sessions"
# Every sub-command that reads settings, with arguments that would otherwise let it run.
COMMANDS = {
    "demo": ["demo", "--objects", "1"],
    "run": ["run", "--table-name", "sessions", "--until-idle"],
    "replay": ["replay", "no-such-file.json"],
    "capture": ["capture", "--stream-arn", f"{STREAM}/stream/1", "--out", os.devnull],
    "redrive": ["redrive", "--queue-url", "http://127.0.0.1:9/123456789012/none", "--wait-seconds", "0"],
    "retag": ["retag", "--queue-url", "http://127.0.0.1:9/123456789012/none", "--wait-seconds", "0"],
    "drain": ["drain", "--queue-url", "http://127.0.0.1:9/123456789012/none", "--until-idle", "--wait", "0"],
    "sweep": ["sweep", "--table-name", "sessions"],
    "check": ["check"],
    "status": ["status", "--table-name", "sessions"],
    "reconcile": ["reconcile"],
    "canary": ["canary"],
    "switch": ["switch", "status"],
}
BAD = {
    "METRICS_DESTINATION": "nonsense",
    "LOG_LEVEL": "loud",
    "MAX_CONCURRENCY": "0",
    "DEAD_LETTER_PREFIX": "sessions/dead-letter/",  # under SCRATCH_ROOT, in the scratch bucket
}
SCRATCH = {"SCRATCH_BUCKET": "scratch", "SCRATCH_ROOT": "sessions/"}


def test_every_command_that_reads_settings_is_covered() -> None:
    # ``health`` answers a bad setting with exit 1, as a health check must (tests/test_health.py).
    assert set(COMMANDS) | {"kcl", "health"} == set(cli.COMMANDS)


@pytest.fixture
def bad_env(aws: object, monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """The moto server's environment (no call can leave the machine), put back afterwards.

    The whole environment is restored, not only what the test set: a command that ran anyway (the demo points the
    process at its own moto server) must not leave the next test talking to a server that is gone.
    """
    environment = dict(os.environ)
    for name, value in SCRATCH.items():
        monkeypatch.setenv(name, value)
    yield monkeypatch
    os.environ.clear()
    os.environ.update(environment)


def expect_one_line(err: str, command: str, variable: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"cleanup-worker {command}: configuration error: {variable}: "), err
    assert "Traceback" not in err and "validation error" not in err and "errors.pydantic.dev" not in err


# The preflight reports an overlapping dead-letter prefix as a failed check instead (tests/test_check.py).
CASES = [(c, v) for c in sorted(COMMANDS) for v in sorted(BAD) if (c, v) != ("check", "DEAD_LETTER_PREFIX")]


@pytest.mark.parametrize(("command", "variable"), CASES)
def test_a_bad_setting_ends_every_command_with_one_line_and_exit_2(
    command: str, variable: str, bad_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad_env.setenv(variable, BAD[variable])

    code = cli.main(COMMANDS[command])

    captured = capsys.readouterr()
    assert code == 2
    expect_one_line(captured.err, command, variable)
    assert captured.out == ""


@pytest.mark.parametrize("variable", ["METRICS_DESTINATION", "DEAD_LETTER_PREFIX"])
def test_a_bad_setting_ends_the_kcl_record_processor_with_one_line_and_exit_2(variable: str, aws: object) -> None:
    env = {**os.environ, **SCRATCH, variable: BAD[variable]}

    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "kcl"],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )

    assert done.returncode == 2
    expect_one_line(done.stderr, "kcl", variable)
    assert done.stdout == ""  # the protocol channel carries nothing


def test_the_error_names_every_bad_variable_in_one_line(
    bad_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for variable, value in BAD.items():
        bad_env.setenv(variable, value)

    assert cli.main(COMMANDS["replay"]) == 2

    [line] = capsys.readouterr().err.splitlines()
    assert all(f"{variable}: " in line for variable in BAD)
    assert "'nonsense'" in line and "'loud'" in line and "overlaps SCRATCH_ROOT 'sessions/'" in line


@pytest.fixture
def in_lambda(bad_env: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    bad_env.setenv("AWS_LAMBDA_FUNCTION_NAME", "cleanup")
    lambda_handler.warm.forget()
    sweep.warm.forget()
    yield bad_env
    lambda_handler.warm.forget()
    sweep.warm.forget()


@pytest.mark.parametrize("variable", ["METRICS_DESTINATION", "DEAD_LETTER_PREFIX", "MAX_CONCURRENCY"])
def test_lambda_fails_the_invocation_with_one_json_error_line_and_recovers_once_fixed(
    variable: str, in_lambda: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], stack: SessionStack
) -> None:
    in_lambda.setenv(variable, BAD[variable])
    in_lambda.setenv("SESSION_TABLE", stack.table)

    with pytest.raises(ConfigurationError) as failed:
        lambda_handler.handler({"Records": []}, None)

    out = capsys.readouterr().out
    [line] = out.splitlines()
    logged = json.loads(line)
    assert logged["level"] == "ERROR" and variable in logged["variables"]
    assert logged["message"] == str(failed.value) and "\n" not in str(failed.value)
    assert failed.value.__cause__ is None and failed.value.__context__ is None  # no pydantic dump chained to it
    assert not lambda_handler.warm.ready

    in_lambda.delenv(variable)  # fixed: the next invocation reads the environment again
    assert lambda_handler.handler({"Records": []}, None) == {"batchItemFailures": []}


def test_the_sweeper_lambda_fails_with_one_json_error_line_and_recovers_once_fixed(
    in_lambda: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], stack: SessionStack
) -> None:
    table = f"{stack.table}-indexed"
    create_session_table(stack.ddb, table, expiry_index="expiry-index")
    in_lambda.setenv("SESSION_TABLE", table)
    in_lambda.setenv("EXPIRY_INDEX", "expiry-index")
    in_lambda.setenv("LOG_LEVEL", "loud")

    with pytest.raises(ConfigurationError):
        sweep.handler({}, None)

    [line] = capsys.readouterr().out.splitlines()
    assert json.loads(line)["variables"] == {
        "LOG_LEVEL": "must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL: 'loud'"
    }
    assert not sweep.warm.ready

    in_lambda.setenv("LOG_LEVEL", "INFO")
    assert sweep.handler({}, None)["failedBuckets"] == 0
