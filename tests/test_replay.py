"""``cleanup-worker replay``: every file shape, precise errors, exit codes, and a dry run that writes nothing."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import botocore.session
import pytest

from cleanup.aws.clients import Clients
from cleanup.exceptions import SourceFileError
from cleanup.operations.sources import FileReader, FileRecord, read_file
from cleanup.queues.deadletter import MESSAGE_FORMAT
from cleanup.runtime import Runtime
from cleanup.telemetry import Metrics, MetricsSink
from tests.stack import SessionStack, client
from worker import cli, progress, replay
from worker.local.backend import create_session_table

EVENTS = Path(__file__).parent / "events"
DOCS_EVENT = EVENTS / "dynamodb-streams-lambda-event.json"
CAPTURED = {  # one moto stream read three ways: INSERT/MODIFY/REMOVE of a1 (explicit), INSERT/REMOVE of b2 (TTL)
    "getrecords": EVENTS / "getrecords-response.json",
    "jsonl": EVENTS / "captured.jsonl",
    "kcl": EVENTS / "kcl-process-records.json",
}
CAPTURED_TABLE = "sessions-cb46267778"  # the table the captured records came from
READS = {"BatchGetItem", "GetBucketVersioning", "ListObjectsV2", "ListObjectVersions", "ListGrants"}


def replay_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = cli.main(["replay", "--json", *argv])
    return code, json.loads(capsys.readouterr().out)


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def test_the_documentation_sample_event_is_read_and_skipped_as_another_tables(worker_env, capsys):
    code = cli.main(["replay", "--json", str(DOCS_EVENT)])

    captured = capsys.readouterr()
    assert code == 2  # none of its records is SESSION_TABLE's: a replay that can never clean anything
    assert json.loads(captured.out) == {"records": 3, "cleaned": 0, "planned": 0, "skipped": 3, "failed": []}
    assert "every record is an item of 'ExampleTableWithStream', none of SESSION_TABLE" in captured.err


@pytest.mark.parametrize("shape", sorted(CAPTURED))
def test_captured_records_clean_their_sessions_in_every_shape(worker_env, capsys, shape, monkeypatch):
    stack = worker_env
    ensure_table(stack, CAPTURED_TABLE)  # the records name their table; the race check reads it
    monkeypatch.setenv("SESSION_TABLE", CAPTURED_TABLE)  # the sessions' table (a Kinesis stream may carry others)
    for prefix in ("sessions/t1/a1/", "sessions/t2/b2/", "sessions/t1/live/"):
        stack.s3.put_object(Bucket=stack.bucket, Key=f"{prefix}part-0", Body=b"x")

    code, summary = replay_json(capsys, str(CAPTURED[shape]))

    assert (code, summary) == (0, {"records": 5, "cleaned": 2, "planned": 0, "skipped": 3, "failed": []})
    assert stack.objects("sessions/t1/a1/") == stack.objects("sessions/t2/b2/") == []
    assert stack.objects("sessions/t1/live/") == ["sessions/t1/live/part-0"]


def test_a_replayed_capture_retires_the_grant_and_deletes_the_prefix(worker_env, capsys, tmp_path):
    stack = worker_env
    gone, live = stack.put_session("gone", connection_id="c-gone"), stack.put_session("live")
    stack.expire("gone")
    path = write_jsonl(tmp_path / "records.jsonl", stack.new_records())

    code = cli.main(["replay", str(path)])

    table = capsys.readouterr().out
    assert code == 0
    assert stack.objects(gone["scratchPrefix"]) == []
    assert gone["grantId"] not in stack.grant_ids() and live["grantId"] in stack.grant_ids()
    assert len(stack.objects(live["scratchPrefix"])) == 3
    assert f"retire {gone['grantId']} on {stack.key_arn}: done" in table
    assert "3 records: 1 cleaned, 2 skipped, 0 failed" in table


def test_malformed_lines_are_named_by_file_line_and_sequence_number(worker_env, capsys, tmp_path):
    good, bad = json.loads(CAPTURED["jsonl"].read_text().splitlines()[0]), {"dynamodb": {"SequenceNumber": "900"}}
    bad["dynamodb"]["Keys"] = "not a map"
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps(good) + "\n{not json\n" + json.dumps(bad) + "\n")

    code, summary = replay_json(capsys, str(path))

    assert code == 1
    assert summary["records"] == 3 and summary["skipped"] == 1
    assert summary["failed"][0]["sequenceNumber"] == "900"
    assert summary["failed"][0]["error"].startswith(f"{path}:3: malformed stream record at dynamodb.Keys")
    assert summary["failed"][1]["sequenceNumber"] is None
    assert summary["failed"][1]["error"].startswith(f"{path}:2: not JSON")


def test_a_malformed_record_in_an_event_is_named_by_its_own_line(worker_env, capsys, tmp_path):
    event = json.loads(DOCS_EVENT.read_text())
    event["Records"][2]["dynamodb"]["OldImage"] = ["not", "a", "map"]
    text = json.dumps(event, indent=2)
    line = text.splitlines().index('      "eventID": "3",')  # the line before it opens the record
    path = tmp_path / "event.json"
    path.write_text(text)

    code, summary = replay_json(capsys, str(path))

    assert code == 1
    (failure,) = summary["failed"]
    assert failure["sequenceNumber"] == "333"
    assert failure["error"].startswith(f"{path}:{line} (Records[2]): malformed stream record at dynamodb.OldImage")


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "cannot read"), ('{"Records": [\n  {"a": 1},\n', ":3:1: not JSON"), ('{"hello": 1}', "not a known shape")],
)
def test_unreadable_files_are_usage_errors(worker_env, capsys, tmp_path, content, message):
    path = tmp_path / "input.json"
    if content is not None:
        path.write_text(content)

    code = cli.main(["replay", str(path)])

    assert code == 2
    assert message in capsys.readouterr().err


def test_a_configuration_error_exits_2(worker_env, capsys, monkeypatch):
    monkeypatch.setenv("SCRATCH_ROOT", "../")

    assert cli.main(["replay", str(DOCS_EVENT)]) == 2
    assert "SCRATCH_ROOT" in capsys.readouterr().err


def test_a_dry_run_reports_the_plan_and_changes_nothing(worker_env, capsys, tmp_path):
    stack = worker_env
    item = stack.put_session("d1", connection_id="conn-d1", objects=4)
    stack.delete("d1")
    path = write_jsonl(tmp_path / "records.jsonl", stack.new_records())

    code, summary = replay_json(capsys, "--dry-run", str(path))

    assert code == 0
    assert len(stack.objects(item["scratchPrefix"])) == 4 and item["grantId"] in stack.grant_ids()
    assert (summary["cleaned"], summary["planned"]) == (0, 1)
    (remove,) = [line for line in summary["plan"] if line["status"] == "planned"]
    assert remove["reason"] == "explicit"
    assert remove["actions"] == {
        "connection": {"status": "planned", "connectionId": "conn-d1", "endpoint": stack.aws.endpoint_url},
        "grant": {"status": "planned", "grantId": item["grantId"], "keyId": stack.key_arn},
        "scratch": {"status": "planned", "bucket": stack.bucket, "prefix": item["scratchPrefix"], "objects": 4},
    }


def test_a_dry_run_shows_what_the_guard_would_refuse(worker_env, capsys, tmp_path):
    stack = worker_env
    stack.s3.put_object(Bucket=stack.bucket, Key="shared/x", Body=b"keep")
    stack.put_session("r1", grant=False, objects=0, extra={"scratchPrefix": "shared/"})
    stack.delete("r1")
    path = write_jsonl(tmp_path / "records.jsonl", stack.new_records())

    code = cli.main(["replay", "--dry-run", str(path)])

    table = capsys.readouterr().out
    assert code == 1
    assert "delete shared/: refused: " in table
    assert stack.objects("shared/") == ["shared/x"]


def counting_runtime(stack: SessionStack, calls: list[str], **overrides: Any) -> Runtime:
    """A runtime whose every AWS call is recorded (botocore's before-call event, on every client it makes)."""
    session = botocore.session.get_session()
    session.register("before-call.*.*", lambda model, **_: calls.append(model.name))
    settings = stack.settings(ws_callback_url=stack.aws.endpoint_url, **overrides)
    return Runtime(settings, Clients(settings, session), Metrics(settings, MetricsSink("off")))


@pytest.mark.parametrize("versioned", [False, True])
def test_a_dry_run_sends_no_write_call(aws, request, tmp_path, versioned):
    stack = SessionStack.create(aws, request.node.name, versioned=versioned)
    stack.put_session("w1", connection_id="conn-w1")
    stack.delete("w1")
    path = write_jsonl(tmp_path / "records.jsonl", stack.new_records())
    args = argparse.Namespace(files=[str(path)], as_json=True)
    dry, enforced = [], []

    dry_code = replay.run(args, counting_runtime(stack, dry, cleanup_mode="dry-run"), io.StringIO())
    enforce_code = replay.run(args, counting_runtime(stack, enforced), io.StringIO())

    assert dry_code == enforce_code == 0
    assert set(dry) <= READS and "BatchGetItem" in dry  # the race check reads the live item, in a batch
    assert ("ListObjectVersions" if versioned else "ListObjectsV2") in dry
    assert {"DeleteConnection", "RetireGrant", "DeleteObjects"} <= set(enforced)


def test_a_dry_run_sends_nothing_to_the_dead_letter_queue(worker_env, capsys, tmp_path, monkeypatch):
    stack = worker_env
    sqs = client("sqs")
    queue = sqs.create_queue(QueueName=f"dlq-{stack.table}")["QueueUrl"]
    monkeypatch.setenv("DEAD_LETTER_QUEUE_URL", queue)
    stack.put_session("r2", grant=False, objects=0, extra={"scratchPrefix": "sessions/../x/"})
    stack.delete("r2")
    path = write_jsonl(tmp_path / "records.jsonl", stack.new_records())

    assert cli.main(["replay", "--dry-run", str(path)]) == 1  # refused, reported, and not dead-lettered
    assert "refused" in capsys.readouterr().out
    assert sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=0).get("Messages", []) == []


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_shows_on_a_terminal_only_and_never_with_json():
    terminal, piped, quiet = Terminal(), io.StringIO(), Terminal()
    for stream, json_output in ((terminal, False), (piped, False), (quiet, True)):
        with progress.bar("replay", total=1000, stream=stream, quiet=json_output, mininterval=0) as shown:
            shown.update(500)

    assert "500/1000" in terminal.getvalue() and "records/s" in terminal.getvalue()
    assert piped.getvalue() == quiet.getvalue() == ""


def ensure_table(stack: SessionStack, name: str) -> None:
    try:
        stack.ddb.describe_table(TableName=name)
    except stack.ddb.exceptions.ResourceNotFoundException:
        create_session_table(stack.ddb, name, view_type=None, ttl=False)


def test_a_failed_record_holds_back_later_records_of_its_item_across_chunks(worker_env, tmp_path):
    stack = worker_env
    stack.s3.put_object(Bucket=stack.bucket, Key="shared/keep", Body=b"x")
    stack.put_session("same", grant=False, objects=0, extra={"scratchPrefix": "shared/"})
    stack.delete("same")  # refused by the guard: fails
    again = stack.put_session("same", grant=False)
    stack.delete("same")  # the same item's next REMOVE must not run ahead of the failed one
    path = write_jsonl(tmp_path / "records.jsonl", stack.new_records())
    entries = [entry for entry in FileReader([str(path)]) if isinstance(entry, FileRecord)]

    results = replay.replay(entries, stack.runtime(ws_callback_url=stack.aws.endpoint_url), chunk=1)

    statuses = [result.outcome.status.value for result in results]
    assert statuses == ["skipped", "failed", "failed", "failed"]  # as the pipeline does within a batch
    assert results[-1].outcome.error.startswith("not attempted: an earlier record of the same item")
    assert len(stack.objects(again["scratchPrefix"])) == 3 and stack.objects("shared/") == ["shared/keep"]


def test_a_kcl_transcript_in_json_lines_yields_the_records_of_its_process_records_messages(
    worker_env, capsys, tmp_path, monkeypatch
):
    stack = worker_env
    ensure_table(stack, CAPTURED_TABLE)
    monkeypatch.setenv("SESSION_TABLE", CAPTURED_TABLE)
    message = json.loads(CAPTURED["kcl"].read_text())
    transcript = [
        {"action": "initialize", "shardId": "shardId-000000000000", "sequenceNumber": "TRIM_HORIZON"},
        message,
        {"action": "shutdownRequested"},
    ]
    path = write_jsonl(tmp_path / "kcl.jsonl", transcript)

    code, summary = replay_json(capsys, str(path))

    assert (code, summary) == (0, {"records": 5, "cleaned": 2, "planned": 0, "skipped": 3, "failed": []})


def test_a_dead_letter_message_whose_record_is_in_s3_is_reported_with_where_it_is(worker_env, capsys, tmp_path):
    stack = worker_env
    stack.put_session("dl", grant=False)
    stack.delete("dl")
    record = stack.lambda_event()["Records"][-1]
    number = record["dynamodb"]["SequenceNumber"]
    stored = {"bucket": stack.bucket, "key": f"dead-letter/2025/01/02/{number}-{'0' * 32}.json"}
    message = {"format": MESSAGE_FORMAT, "sequenceNumber": number, "source": "lambda", "recordObject": stored}
    path = write_jsonl(tmp_path / "dead-letters.jsonl", [message])

    code, summary = replay_json(capsys, str(path))

    assert code == 1
    [failed] = summary["failed"]
    assert failed["sequenceNumber"] == number
    assert f"s3://{stack.bucket}/{stored['key']}" in failed["error"] and "cleanup-worker redrive" in failed["error"]
    assert len(stack.objects("sessions/t1/dl/")) == 3  # not cleaned: the record was not in the file


def test_json_nested_too_deeply_is_rejected_by_line_and_the_other_lines_are_read(tmp_path: Path) -> None:
    deep = "[" * 200_000 + "]" * 200_000
    record = json.loads((Path(__file__).parent / "events" / "dynamodb-streams-lambda-event.json").read_text())[
        "Records"
    ][0]
    lines = tmp_path / "records.jsonl"
    lines.write_text(f"{deep}\n{json.dumps(record)}\n")
    whole = tmp_path / "record.json"
    whole.write_text(deep)

    entries = read_file(lines)

    assert [type(entry).__name__ for entry in entries] == ["Rejected", "FileRecord"]
    assert entries[0].location.line == 1 and "too deeply" in entries[0].error  # type: ignore[union-attr]
    with pytest.raises(SourceFileError, match="too deeply"):
        read_file(whole)
