"""The commands an operator runs by hand never delete what they did not clean: redrive keeps a message whose record
was skipped, ``--function-name`` runs a command with the deployed function's exact settings, and replay says when
its records are not SESSION_TABLE's."""

from __future__ import annotations

import io
import json
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from cleanup.queues.deadletter import message_body
from cleanup.queues.integrity import seal
from schemas.outcomes import Outcome, Status
from schemas.records import Source, read_record
from schemas.settings import AttributeNames
from tests.queues import on_queue, send
from tests.stack import SessionStack, client
from tests.test_connection_pattern import PATTERN, end
from worker import cli
from worker.local.gateway import LocalGateway

EVENTS = Path(__file__).parent / "events"


def deployed_function(name: str, variables: dict[str, str]) -> str:
    """A Lambda function whose environment holds ``variables`` (what the template sets on the cleanup function)."""
    iam = client("iam")
    try:
        role = iam.get_role(RoleName="cleanup-role")["Role"]["Arn"]
    except iam.exceptions.NoSuchEntityException:
        role = iam.create_role(RoleName="cleanup-role", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as archive:
        archive.writestr("worker/lambda_handler.py", "def handler(event, context):\n    return {}\n")
    client("lambda").create_function(
        FunctionName=name,
        Runtime="python3.12",
        Role=role,
        Handler="worker.lambda_handler.handler",
        Code={"ZipFile": code.getvalue()},
        Environment={"Variables": variables},
    )
    return name


def connection_rows_function(stack: SessionStack, gateway: LocalGateway) -> str:
    """The cleanup function of a ``conn#<id>`` / ``metadata`` / ``expires_at`` table (docs/configure.md)."""
    return deployed_function(
        f"cleanup-{stack.table}",
        {
            "SESSION_TABLE": stack.table,
            "SCRATCH_BUCKET": stack.bucket,
            "KMS_KEY_ID": stack.key_arn,
            "INTEGRITY_KEY_ID": stack.mac_key_arn,
            "WS_CALLBACK_URL": gateway.callback_url,
            "ATTR_CONNECTION_ID": "pk",
            "ATTR_TTL": "expires_at",
            "SESSION_SORT_KEY": "metadata",
            "CONNECTION_ID_PATTERN": PATTERN,
            "LOG_LEVEL": "INFO",
        },
    )


def dead_letter_of_a_connection_row(stack: SessionStack, connection_id: str) -> str:
    """The dead-letter message the function wrote for the REMOVE of ``conn#<connection_id>`` (a row that holds only
    the connection: ATTR_CONNECTION_ID=pk is what makes it a session)."""
    key = f"conn#{connection_id}"
    stack.put_item({"pk": key, "sk": "metadata", "expires_at": int(time.time()) + 3600})
    end(stack, key)
    [raw] = [r for r in stack.lambda_event()["Records"] if r["eventName"] == "REMOVE"]
    record = read_record(raw, Source.LAMBDA)
    failed = Outcome(sequence_number=record.sequence_number, status=Status.FAILED, error="ThrottlingException")
    names = AttributeNames(connection_id="pk", ttl="expires_at")
    return seal(message_body(failed, record, names=names), stack.runtime())


def redrive(capsys: pytest.CaptureFixture[str], queue: str, *options: str) -> tuple[int, dict[str, Any]]:
    code = cli.main(["redrive", "--queue-url", queue, "--wait-seconds", "0", "--json", *options])
    return code, json.loads(capsys.readouterr().out)


def test_redrive_keeps_a_message_whose_record_it_skipped_and_cleans_it_with_the_functions_settings(
    worker_env: SessionStack, gateway: LocalGateway, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = worker_env  # the operator's shell: the worker's settings, but for the table's shape
    socket = gateway.connect()
    body = dead_letter_of_a_connection_row(stack, socket.connection_id)
    queue = str(client("sqs").create_queue(QueueName=f"dead-letters-{stack.table}")["QueueUrl"])
    send(queue, body)
    function = connection_rows_function(stack, gateway)

    monkeypatch.setenv("CLEANUP_MODE", "dry-run")
    planned = redrive(capsys, queue)
    monkeypatch.delenv("CLEANUP_MODE")
    skipped = redrive(capsys, queue)
    cleaned = redrive(capsys, queue, "--function-name", function)

    records = {"cleaned": 0, "skipped": 1, "failed": 0, "notRemovals": 0}
    assert planned[0] == 1 and (planned[1]["wouldDelete"], planned[1]["records"]) == (0, records)
    assert skipped[0] == 1 and (skipped[1]["deleted"], skipped[1]["records"]) == (0, records)
    [kept] = skipped[1]["kept"]
    assert "not a session" in kept["skipped"][0]["reason"] and kept["failed"] == []
    assert cleaned[0] == 0 and (cleaned[1]["deleted"], cleaned[1]["records"]["cleaned"]) == (1, 1)
    assert socket.wait_closed(5.0) and on_queue(queue) == []


def test_the_readable_redrive_report_says_which_records_were_skipped_and_why(
    worker_env: SessionStack, gateway: LocalGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    stack = worker_env
    socket = gateway.connect()
    body = dead_letter_of_a_connection_row(stack, socket.connection_id)
    queue = str(client("sqs").create_queue(QueueName=f"dead-letters-{stack.table}")["QueueUrl"])
    send(queue, body)

    code = cli.main(["redrive", "--queue-url", queue, "--wait-seconds", "0"])

    out = capsys.readouterr().out
    assert code == 1 and "1 records: 0 cleaned, 1 skipped, 0 failed  kept" in out
    assert "    skipped " in out and "not a session" in out and "--function-name" in out
    assert on_queue(queue) == [body] and gateway.is_open(socket.connection_id)
    socket.close()


def test_delete_skipped_deletes_a_message_whose_only_records_left_were_skipped(
    worker_env: SessionStack, gateway: LocalGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    stack = worker_env
    socket = gateway.connect()
    queue = str(client("sqs").create_queue(QueueName=f"dead-letters-{stack.table}")["QueueUrl"])
    send(queue, dead_letter_of_a_connection_row(stack, socket.connection_id))

    code, summary = redrive(capsys, queue, "--delete-skipped")

    assert (code, summary["deleted"], summary["records"]["skipped"]) == (0, 1, 1) and on_queue(queue) == []
    socket.close()


def test_a_function_name_that_cannot_be_read_is_a_usage_error(
    worker_env: SessionStack, capsys: pytest.CaptureFixture[str]
) -> None:
    queue = str(client("sqs").create_queue(QueueName=f"dead-letters-{worker_env.table}")["QueueUrl"])

    code = cli.main(["redrive", "--queue-url", queue, "--function-name", "no-such-function", "--wait-seconds", "0"])

    err = capsys.readouterr().err
    assert code == 2 and "cannot take the settings of function 'no-such-function'" in err


def test_replay_refuses_a_session_table_that_does_not_exist(
    worker_env: SessionStack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stack = worker_env
    session = stack.put_session("typo")
    stack.delete("typo")
    capture = write_records(stack, tmp_path / "records.jsonl")
    monkeypatch.setenv("SESSION_TABLE", f"{stack.table}-typo")  # conections for connections

    code = cli.main(["replay", "--json", str(capture)])

    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""  # refused before any record is read
    assert f"SESSION_TABLE '{stack.table}-typo' does not exist" in captured.err
    assert session["grantId"] in stack.grant_ids()


def test_replay_says_when_every_record_is_another_tables_and_exits_non_zero(
    worker_env: SessionStack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stack = worker_env
    session = stack.put_session("elsewhere")
    stack.delete("elsewhere")
    capture = write_records(stack, tmp_path / "records.jsonl")
    other = SessionStack.create(stack.aws, "replay-other-table")
    monkeypatch.setenv("SESSION_TABLE", other.table)  # a table that exists, but not the records'

    code = cli.main(["replay", "--json", str(capture)])

    captured = capsys.readouterr()
    assert code == 2 and json.loads(captured.out)["skipped"] == 2
    assert f"every record is an item of '{stack.table}', none of SESSION_TABLE '{other.table}'" in captured.err
    assert session["grantId"] in stack.grant_ids()


def test_replay_with_the_functions_settings_cleans_what_the_shell_would_skip(
    worker_env: SessionStack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stack = worker_env
    session = stack.put_session("shaped")
    stack.delete("shaped")
    capture = write_records(stack, tmp_path / "records.jsonl")
    settings = {"SESSION_TABLE": stack.table, "KMS_KEY_ID": stack.key_arn, "SCRATCH_BUCKET": stack.bucket}
    function = deployed_function(f"cleanup-{stack.table}", settings)
    monkeypatch.setenv("SESSION_TABLE", "someone-elses")  # the shell's setting, which the function's replaces

    code = cli.main(["replay", "--json", "--function-name", function, str(capture)])

    assert code == 0 and json.loads(capsys.readouterr().out)["cleaned"] == 1
    assert session["grantId"] not in stack.grant_ids() and stack.objects(session["scratchPrefix"]) == []


def write_records(stack: SessionStack, path: Path) -> Path:
    """The stream's new records as JSON lines, as ``capture`` writes them."""
    path.write_text("".join(json.dumps(record, default=str) + "\n" for record in stack.lambda_event()["Records"]))
    return path


def test_the_functions_settings_replace_the_shells_but_for_a_dry_run_and_the_commands_output() -> None:
    from worker.function_settings import changes

    function = {"ATTR_TTL": "expires_at", "CLEANUP_MODE": "enforce", "LOG_LEVEL": "INFO", "AWS_REGION": "eu-west-1"}
    shell = {"ATTR_PK": "id", "CLEANUP_MODE": "dry-run", "LOG_LEVEL": "WARNING", "AWS_REGION": "us-east-1"}

    assert changes(function, shell) == {"ATTR_TTL": "expires_at", "ATTR_PK": None}
    assert changes({"CLEANUP_MODE": "dry-run"}, {"CLEANUP_MODE": "enforce"}) == {"CLEANUP_MODE": "dry-run"}
