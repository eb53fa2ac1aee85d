"""The example events under events/ are real event shapes: each replays in a dry run, and the Lambda handler takes
each as `sam local invoke -e` would hand it over."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.stack import SessionStack, client, table_exists
from worker import cli, lambda_handler

EVENTS = sorted((Path(__file__).parent.parent / "events").glob("lambda-*.json"))
TABLE = "sessions"  # the table the example events name


@pytest.fixture
def example_env(worker_env: SessionStack, monkeypatch: pytest.MonkeyPatch) -> SessionStack:
    ddb = client("dynamodb")
    if not table_exists(ddb, TABLE):
        ddb.create_table(
            TableName=TABLE,
            AttributeDefinitions=[{"AttributeName": n, "AttributeType": "S"} for n in ("pk", "sk")],
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            BillingMode="PAY_PER_REQUEST",
        )
    monkeypatch.setenv("SESSION_TABLE", TABLE)
    monkeypatch.setenv("WS_CALLBACK_URL", "https://abcdef1234.execute-api.eu-west-1.amazonaws.com/prod")
    return worker_env


def test_there_is_an_example_of_each_source() -> None:
    assert [path.name for path in EVENTS] == [
        "lambda-dynamodb-explicit-remove.json",
        "lambda-dynamodb-ttl-remove.json",
        "lambda-kinesis-remove.json",
    ]


REASON = {
    "lambda-dynamodb-explicit-remove": "explicit",
    "lambda-dynamodb-ttl-remove": "ttl",
    "lambda-kinesis-remove": "ttl",
}


@pytest.mark.parametrize("event", EVENTS, ids=lambda path: path.stem)
def test_each_example_replays_in_a_dry_run_planning_every_action(
    event: Path, example_env: SessionStack, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["replay", "--dry-run", "--json", str(event)])

    summary = json.loads(capsys.readouterr().out)
    [planned] = summary["plan"]
    assert code == 0 and summary["records"] == 1 and not summary["failed"]
    assert planned["reason"] == REASON[event.stem]
    # The dry run asks KMS for the grant, as the binding does before retiring it: the example's grant is in no key
    # of the test's, so it reads as retired already.
    assert {name: action["status"] for name, action in planned["actions"].items()} == {
        "connection": "planned",
        "grant": "already-done",
        "scratch": "planned",
    }


@pytest.mark.parametrize("event", EVENTS, ids=lambda path: path.stem)
def test_the_lambda_handler_takes_each_example_as_sam_local_invoke_hands_it(
    event: Path, example_env: SessionStack
) -> None:
    runtime = example_env.runtime(
        session_table=TABLE,
        cleanup_mode="dry-run",
        ws_callback_url="https://abcdef1234.execute-api.eu-west-1.amazonaws.com/prod",
    )

    with lambda_handler.warm.use(runtime):
        answer = lambda_handler.handler(json.loads(event.read_text()), None)

    assert answer == {"batchItemFailures": []}
