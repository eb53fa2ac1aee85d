"""Logs and metrics: one JSON line per record outcome, and EMF documents CloudWatch can read."""

from __future__ import annotations

import io
import json
import socket
import threading

import pytest

from cleanup.aws.clients import Clients
from cleanup.queues.reporting import run_batch
from cleanup.runtime import Runtime
from cleanup.telemetry import Metrics, MetricsSink, configure_logging, log
from schemas.outcomes import ActionResult, ActionStatus, Outcome, Status
from schemas.records import read_lambda_event
from schemas.settings import Settings
from tests.stack import SessionStack


def emf(stream: io.StringIO) -> dict[str, object]:
    """Metric name (with its dimension value, if any) -> value, from the EMF documents written to ``stream``."""
    found: dict[str, object] = {}
    for line in stream.getvalue().splitlines():
        doc = json.loads(line)
        directive = doc["_aws"]["CloudWatchMetrics"][0]
        name = directive["Metrics"][0]["Name"]
        dims = [d for d in directive["Dimensions"][0] if d != "Service"]
        assert doc["Service"] == "session-cleanup"
        found[name + "".join(f"[{doc[d]}]" for d in dims)] = doc[name]
    return found


def test_cleaned_sessions_are_counted_by_reason_and_ttl_lag_is_measured(stack: SessionStack) -> None:
    stack.put_session("ttl", ttl=1_000)
    stack.put_session("explicit")
    stack.put_session("nokey")
    stack.expire("ttl")
    stack.delete("explicit")
    stack.put_item({"pk": "session#nokey", "sk": "meta", "grantId": "g", "kmsKeyId": "", "scratchPrefix": "/"})
    stack.delete("nokey")
    out = io.StringIO()
    settings = stack.settings(metrics_destination="stdout")
    runtime = Runtime(settings, Clients(settings), Metrics(settings, MetricsSink("stdout", stream=out)))

    run_batch(read_lambda_event(stack.lambda_event()), runtime)

    metrics = emf(out)
    assert metrics["SessionsCleaned[ttl]"] == 1
    assert metrics["SessionsCleaned[explicit]"] == 1
    assert metrics["RecordsFailed"] == 1
    assert metrics["ActionFailures[scratch]"] == 1
    assert metrics["RecordsSkipped"] == 4  # three inserts and one modify
    lag = metrics["TtlLagSeconds"]
    assert isinstance(lag, list) and len(lag) == 1 and lag[0] > 1_000_000_000


def test_every_record_gets_one_log_line_with_its_outcome(stack: SessionStack) -> None:
    item = stack.put_session("a", connection_id="conn-a=")
    stack.delete("a")
    stream = io.StringIO()
    configure_logging(stack.settings(), stream)
    try:
        outcomes = run_batch(read_lambda_event(stack.lambda_event()), stack.runtime(ws_callback_url=None))
    finally:
        log.handlers.clear()

    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    by_seq = {line["sequenceNumber"]: line for line in lines if "sequenceNumber" in line}
    assert set(by_seq) == {o.sequence_number for o in outcomes}
    remove = by_seq[outcomes[-1].sequence_number]
    assert remove["level"] == "WARNING"  # no callback endpoint: the socket cannot be closed
    assert remove["reason"] == "explicit"
    assert remove["tenantId"] == "t1"
    assert remove["actions"]["grant"]["status"] == "done"
    assert remove["actions"]["connection"]["status"] == "failed"
    assert "WS_CALLBACK_URL" in remove["error"]
    assert item["scratchPrefix"] + "part-" not in stream.getvalue()  # no object keys in the logs


def test_in_lambda_metrics_go_to_stdout(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "cleanup")
    MetricsSink("auto").write([{"_aws": {}, "x": 1}])
    assert json.loads(capsys.readouterr().out) == {"_aws": {}, "x": 1}


def test_outside_lambda_metrics_go_to_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("AWS_LAMBDA_FUNCTION_NAME", raising=False)
    MetricsSink("auto").write([{"_aws": {}, "x": 1}])
    captured = capsys.readouterr()
    assert captured.out == ""
    assert json.loads(captured.err) == {"_aws": {}, "x": 1}


def test_metrics_can_go_to_a_cloudwatch_agent_over_tcp() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []

    def accept() -> None:
        conn, _ = server.accept()
        with conn:
            while chunk := conn.recv(65536):
                received.append(chunk)

    thread = threading.Thread(target=accept)
    thread.start()
    port = server.getsockname()[1]
    MetricsSink(f"tcp://127.0.0.1:{port}").write([{"_aws": {}, "n": 1}, {"_aws": {}, "n": 2}])
    thread.join(timeout=5)
    server.close()
    assert [json.loads(line)["n"] for line in b"".join(received).decode().splitlines()] == [1, 2]


def test_an_unknown_metrics_destination_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="METRICS_DESTINATION"):
        MetricsSink("file:///tmp/x")


def test_log_lines_are_json_with_level_and_service() -> None:
    stream = io.StringIO()
    configure_logging(Settings(log_level="INFO"), stream)
    try:
        log.info("hello", extra={"k": 1})
    finally:
        log.handlers.clear()
    line = json.loads(stream.getvalue())
    assert (line["level"], line["message"], line["k"], line["service"]) == ("INFO", "hello", 1, "session-cleanup")


def test_with_hashed_identifiers_no_log_line_at_any_level_names_a_sessions_resources(stack: SessionStack) -> None:
    item = stack.put_session("hashme", tenant="tenant-x", connection_id="conn-hashme=")
    stack.delete("hashme")
    stream = io.StringIO()
    configure_logging(stack.settings(log_identifiers="hashed", log_level="DEBUG"), stream)
    try:
        run_batch(read_lambda_event(stack.lambda_event()), stack.runtime(ws_callback_url=None))
    finally:
        log.handlers.clear()

    text = stream.getvalue()
    for value in (item["grantId"], stack.key_arn, stack.bucket, "hashme", "tenant-x", "conn-hashme="):
        assert value not in text
    [remove] = [json.loads(line) for line in text.splitlines() if '"reason"' in line]
    assert remove["tenantId"].startswith("hmac:") and remove["key"].startswith("hmac:")
    assert remove["actions"]["grant"]["status"] == "done" and remove["actions"]["grant"]["grantId"].startswith("hmac:")


def hashed(settings: Settings, **fields: object) -> dict[str, str]:
    stream = io.StringIO()
    configure_logging(settings, stream)
    try:
        log.info("identifiers", extra=fields)
    finally:
        log.handlers.clear()
    line = json.loads(stream.getvalue())
    return {name: line[name] for name in fields}


def test_hashed_identifiers_are_stable_within_a_deployment_and_differ_between_deployments() -> None:
    one = Settings(log_identifiers="hashed", session_table="sessions-a")

    first, again = hashed(one, tenantId="t1", grantId="g1"), hashed(one, tenantId="t1", grantId="g1")
    [key] = hashed(one, key={"pk": {"S": "session#s1"}}).values()
    other = hashed(Settings(log_identifiers="hashed", session_table="sessions-b"), tenantId="t1")
    keyed = hashed(Settings(log_identifiers="hashed", session_table="sessions-a", log_hash_key="s3cret"), tenantId="t1")

    assert first == again and first["tenantId"] != first["grantId"] and key.startswith("hmac:")
    assert len({first["tenantId"], other["tenantId"], keyed["tenantId"]}) == 3
    assert hashed(Settings(), tenantId="t1") == {"tenantId": "t1"}  # plain, the default


def test_action_failures_of_every_kind_are_also_summed_without_their_action(stack: SessionStack) -> None:
    # An alarm that names kinds misses the others (http-close, an installed kind): the sum over Service has them all.
    out = io.StringIO()
    settings = stack.settings(metrics_destination="stdout")
    metrics = Metrics(settings, MetricsSink("stdout", stream=out))
    failed = [ActionResult(action=kind, status=ActionStatus.FAILED, error="x") for kind in ("http-close", "rooms")]

    metrics.record_outcomes([Outcome(sequence_number="1", status=Status.FAILED, actions=tuple(failed))])
    metrics.flush()

    documents = [json.loads(line) for line in out.getvalue().splitlines()]
    summed = [
        doc
        for doc in documents
        if ["Service"] in doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"] and "ActionFailures" in doc
    ]
    assert sorted(doc["Action"] for doc in summed) == ["http-close", "rooms"]  # each counted once in the sum
    assert sum(doc["ActionFailures"] for doc in summed) == 2
