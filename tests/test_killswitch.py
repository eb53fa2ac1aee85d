"""The kill switch: an AppConfig feature flag served by a local stand-in for the AppConfig agent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from cleanup.deadline import Deadline
from cleanup.exceptions import PausedError
from cleanup.killswitch import Mode
from cleanup.queues.reporting import run_batch
from cleanup.runtime import Runtime
from cleanup.streams.poller import StreamPoller
from schemas.outcomes import Status
from schemas.records import read_lambda_event
from tests.kcl_daemon import KinesisShard
from tests.queues import on_queue
from tests.stack import SessionStack, client
from tests.test_kcl import daemon, deletes  # noqa: F401 (the KCL child fixture)
from tests.test_poller import FakeTime, checkpoint, sequence_numbers
from tests.test_sessions import add_expiry_index
from tests.test_sweep import CapturedMetrics, session
from tests.test_sweep import runtime as sweep_runtime
from tests.waiting import wait_for
from worker import backlog as backlog_handler
from worker import lambda_handler
from worker import sweep as sweep_entry
from worker.cli import main as cli
from worker.local.appconfig import LocalAgent, flag


@pytest.fixture
def agent() -> Iterator[LocalAgent]:
    with LocalAgent() as running:
        yield running


def switch_settings(agent: LocalAgent) -> dict[str, Any]:
    application, environment, profile = agent.names
    return {
        "appconfig_application": application,
        "appconfig_environment": environment,
        "appconfig_profile": profile,
        "appconfig_agent_url": agent.url,
        "appconfig_poll_seconds": 0,
    }


def switched(stack: SessionStack, agent: LocalAgent, sink: CapturedMetrics | None = None, **settings: Any) -> Runtime:
    runtime = stack.runtime(**switch_settings(agent), **settings)
    if sink is not None:
        runtime.metrics.sink = sink
    return runtime


def kept(stack: SessionStack, item: dict[str, Any]) -> bool:
    return len(stack.objects(item["scratchPrefix"])) == 3 and item["grantId"] in stack.grant_ids()


def freed(stack: SessionStack, item: dict[str, Any]) -> bool:
    return stack.objects(item["scratchPrefix"]) == [] and item["grantId"] not in stack.grant_ids()


# The switch itself.
def test_the_flag_decides_and_every_change_is_counted_once(stack: SessionStack, agent: LocalAgent) -> None:
    sink = CapturedMetrics()
    runtime = switched(stack, agent, sink)

    seen = [runtime.refresh_mode()]
    agent.serve(flag(False))
    seen += [runtime.refresh_mode(), runtime.refresh_mode()]
    agent.serve(flag(True, "dry-run"))
    seen.append(runtime.refresh_mode())

    assert seen == [Mode.ENFORCE, Mode.PAUSED, Mode.PAUSED, Mode.DRY_RUN]
    assert runtime.settings.cleanup_mode.value == "dry-run"
    assert [doc["Mode"] for doc in sink.documents if "ModeChanges" in doc] == ["enforce", "paused", "dry-run"]


def test_an_unreachable_agent_leaves_the_last_known_mode(stack: SessionStack, agent: LocalAgent) -> None:
    runtime = switched(stack, agent)
    agent.serve(flag(False))
    assert runtime.refresh_mode() is Mode.PAUSED

    agent.stop()

    assert runtime.refresh_mode() is Mode.PAUSED
    assert runtime.switch.state().source == "last-known"


def test_before_any_reading_the_mode_is_unknown_and_holds_whatever_the_environment_says(
    stack: SessionStack, agent: LocalAgent, caplog: pytest.LogCaptureFixture
) -> None:
    agent.stop()
    sink = CapturedMetrics()

    with caplog.at_level("WARNING", logger="cleanup"):
        modes = [switched(stack, agent, sink, cleanup_mode=mode).refresh_mode() for mode in ("dry-run", "enforce")]

    assert modes == [Mode.PAUSED, Mode.PAUSED]
    assert [record.getMessage() for record in caplog.records] == ["kill switch unknown: holding"] * 2
    assert sink.values("SwitchUnknown") == [1, 1]
    assert not [doc for doc in sink.documents if "ModeChanges" in doc]  # no mode was taken from the switch


def test_the_first_reading_after_an_unknown_start_takes_the_flag(stack: SessionStack, agent: LocalAgent) -> None:
    agent.stop()
    sink = CapturedMetrics()
    runtime = switched(stack, agent, sink)
    assert runtime.refresh_mode() is Mode.PAUSED and runtime.switch.state().source == "unknown"

    agent.start()

    assert runtime.refresh_mode() is Mode.ENFORCE and runtime.switch.state().source == "appconfig"
    assert [doc["Mode"] for doc in sink.documents if "ModeChanges" in doc] == ["enforce"]


def test_a_flag_that_is_not_the_documented_shape_is_not_obeyed(stack: SessionStack, agent: LocalAgent) -> None:
    runtime = switched(stack, agent)
    agent.serve(flag(False))
    runtime.refresh_mode()

    agent.serve(b'{"cleanup": {"enabled": true, "mode": "yolo"}}')

    assert runtime.refresh_mode() is Mode.PAUSED


def test_the_flag_cannot_make_a_dry_run_deployment_enforce(stack: SessionStack, agent: LocalAgent) -> None:
    agent.serve(flag(True, "enforce"))
    assert switched(stack, agent, cleanup_mode="dry-run").refresh_mode() is Mode.DRY_RUN


# Lambda.
def test_lambda_paused_frees_nothing_and_fails_the_batch_then_cleans_it_when_resumed(
    stack: SessionStack, agent: LocalAgent
) -> None:
    item = stack.put_session("s1")
    stack.delete("s1")
    event = stack.lambda_event()
    agent.serve(flag(False))

    with lambda_handler.warm.use(switched(stack, agent)):
        with pytest.raises(PausedError):
            lambda_handler.handler(event, None)
        assert kept(stack, item)
        agent.serve(flag(True, "enforce"))
        answer = lambda_handler.handler(event, None)

    assert answer == {"batchItemFailures": []}
    assert freed(stack, item)


def test_lambda_paused_with_a_backlog_holds_every_session_there_untouched_and_the_drain_cleans_them_once_resumed(
    stack: SessionStack, agent: LocalAgent
) -> None:
    item = stack.put_session("s1")
    stack.delete("s1")
    event = stack.lambda_event()
    backlog = str(client("sqs").create_queue(QueueName=f"paused-{stack.table}")["QueueUrl"])
    runtime = switched(stack, agent, backlog_queue_url=backlog)
    agent.serve(flag(False))

    with lambda_handler.warm.use(runtime):
        answer = lambda_handler.handler(event, None)
    messages = on_queue(backlog)
    held = [json.loads(body) for body in messages]
    with backlog_handler.warm.use(runtime):
        still = backlog_handler.drain(as_sqs(messages), runtime, Deadline.after(30))
        assert kept(stack, item)  # the drain, paused too, releases them
        agent.serve(flag(True, "enforce"))
        drained = backlog_handler.drain(as_sqs(messages), runtime, Deadline.after(30))

    assert answer == {"batchItemFailures": []}  # the stream moves on: nothing is lost, no retry spent
    assert [m["remaining"] for m in held] == [["connection", "grant", "scratch", "registry"]]
    assert len(still["batchItemFailures"]) == 1
    assert drained == {"batchItemFailures": []}
    assert freed(stack, item)


def as_sqs(bodies: list[str]) -> list[dict[str, Any]]:
    """Queue messages as Lambda's SQS event source mapping hands them over."""
    return [
        {"messageId": f"m{n}", "receiptHandle": f"r{n}", "body": body, "attributes": {"ApproximateReceiveCount": "1"}}
        for n, body in enumerate(bodies)
    ]


def test_lambda_dry_run_from_the_flag_frees_nothing(stack: SessionStack, agent: LocalAgent) -> None:
    item = stack.put_session("s1")
    stack.delete("s1")
    agent.serve(flag(True, "dry-run"))

    with lambda_handler.warm.use(switched(stack, agent)), pytest.raises(PausedError):  # planned, and held
        lambda_handler.handler(stack.lambda_event(), None)

    assert kept(stack, item)


# The poller.
def poller(stack: SessionStack, agent: LocalAgent) -> StreamPoller:
    fake = FakeTime()
    runtime = switched(stack, agent, checkpoint_table=f"ckpt-{stack.table}")
    return StreamPoller(runtime, stack.stream_arn, clock=fake.clock, sleep=fake.sleep)


def test_the_poller_paused_checkpoints_nothing_and_cleans_once_resumed(stack: SessionStack, agent: LocalAgent) -> None:
    item = stack.put_session("s1")
    stack.delete("s1")
    agent.serve(flag(False))

    summary = poller(stack, agent).run(until_idle=True)

    assert summary.paused and summary.records == 0
    assert kept(stack, item) and checkpoint(stack) is None
    agent.serve(flag(True, "enforce"))
    poller(stack, agent).run(until_idle=True)
    assert freed(stack, item)
    assert checkpoint(stack)["sequenceNumber"]["S"] == sequence_numbers(stack)[-1]


def test_the_poller_in_a_flagged_dry_run_frees_nothing_and_moves_no_checkpoint(
    stack: SessionStack, agent: LocalAgent
) -> None:
    item = stack.put_session("s1")
    stack.delete("s1")
    agent.serve(flag(True, "dry-run"))

    poller(stack, agent).run(until_idle=True)

    assert kept(stack, item)
    checkpoint_item = checkpoint(stack)
    assert checkpoint_item is None or "sequenceNumber" not in checkpoint_item


def test_records_a_flagged_dry_run_only_planned_are_cleaned_when_enforce_is_back_in_the_same_run(
    stack: SessionStack, agent: LocalAgent
) -> None:
    item = stack.put_session("s1")
    stack.delete("s1")
    agent.serve(flag(True, "dry-run"))
    seen: list[str] = []

    def back_to_enforce(shard_id: str, outcomes: list[Any]) -> None:
        seen.extend(outcome.status.value for outcome in outcomes)
        agent.serve(flag(True, "enforce"))  # after the first (planned) batch

    fake = FakeTime()
    runtime = switched(stack, agent, checkpoint_table=f"ckpt-{stack.table}")
    poller = StreamPoller(
        runtime, stack.stream_arn, clock=fake.clock, sleep=fake.sleep, before_checkpoint=back_to_enforce
    )

    poller.run(until_idle=True)

    assert seen == ["skipped", "planned", "skipped", "cleaned"]
    assert freed(stack, item)
    assert checkpoint(stack)["sequenceNumber"]["S"] == sequence_numbers(stack)[-1]


def test_run_until_idle_exits_1_while_paused_with_the_records_kept(
    worker_env: SessionStack, agent: LocalAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    item = worker_env.put_session("s1")
    worker_env.delete("s1")
    agent.serve(flag(False))
    for name, value in {**agent.env(), "CHECKPOINT_TABLE": f"ckpt-{worker_env.table}"}.items():
        monkeypatch.setenv(name, value)

    code = cli(["run", "--table-name", worker_env.table, "--until-idle"])

    assert code == 1
    assert kept(worker_env, item)


# The KCL processor.
def test_the_kcl_processor_paused_holds_its_batch_until_resumed(stack, agent, daemon) -> None:  # noqa: F811
    item = stack.put_session("s1")
    records = deletes(stack, KinesisShard(), "s1")
    agent.serve(flag(False))
    child = daemon(**agent.env())

    child.post({"action": "processRecords", "records": records, "millisBehindLatest": 0})
    wait_for(lambda: "cleanup mode: paused" in child.stderr(), "the processor to see the pause")

    assert kept(stack, item) and child.requests == []
    agent.serve(flag(True, "enforce"))
    child.await_status("processRecords")
    assert freed(stack, item)
    assert child.checkpoints == [records[-1]["sequenceNumber"]]


# The sweeper.
def test_the_sweeper_paused_deletes_nothing(stack: SessionStack, agent: LocalAgent) -> None:
    add_expiry_index(stack)
    session(stack, "old", expires_in=-600)
    agent.serve(flag(False))

    with sweep_entry.warm.use(sweep_runtime(stack, **switch_settings(agent))):
        answer = sweep_entry.handler({}, None)

    assert answer["paused"] is True
    assert stack.ddb.get_item(TableName=stack.table, Key=stack.key("old"))["Item"]


# A dry run says so.
def test_a_dry_run_logs_and_counts_planned_sessions_and_never_cleaned_ones(
    stack: SessionStack, caplog: pytest.LogCaptureFixture
) -> None:
    stack.put_session("s1")
    stack.delete("s1")
    sink = CapturedMetrics()
    runtime = stack.runtime(cleanup_mode="dry-run")
    runtime.metrics.sink = sink

    with caplog.at_level("INFO", logger="cleanup"):
        run_batch(read_lambda_event(stack.lambda_event()), runtime)

    assert sink.values("SessionsPlanned", Reason="explicit") == [1]
    assert sink.values("SessionsCleaned") == []
    messages = [record.getMessage() for record in caplog.records]
    assert "record planned" in messages and "record cleaned" not in messages


def test_a_record_that_cannot_be_read_in_a_paused_batch_fails_alone(stack: SessionStack) -> None:
    stack.put_session("good", objects=1)
    stack.put_session("bad", objects=1)
    stack.delete("good")
    stack.delete("bad")
    event = stack.lambda_event()
    for raw in event["Records"]:
        if raw["eventName"] == "REMOVE" and raw["dynamodb"]["Keys"]["pk"]["S"] == "session#bad":
            del raw["dynamodb"]["OldImage"]  # a KEYS_ONLY record, or a hand-made one

    held = run_batch(read_lambda_event(event), stack.runtime(), held="paused")
    outcomes = [o for o in held if o.event_name == "REMOVE"]

    assert [(o.key.endswith("pk=session#good,sk=meta"), o.status, o.permanent) for o in outcomes] == [
        (True, Status.FAILED, False),  # held for the backlog
        (False, Status.FAILED, True),  # reported (dead-lettered with a queue), the batch goes on
    ]


def test_lambda_paused_with_a_backlog_but_no_integrity_key_leaves_the_batch_in_the_stream_not_in_a_queue_it_refuses(
    stack: SessionStack, agent: LocalAgent
) -> None:
    """Untagged messages are refused by the drain (kept for a human): without INTEGRITY_KEY_ID nothing goes there."""
    item = stack.put_session("s1")
    stack.delete("s1")
    backlog = str(client("sqs").create_queue(QueueName=f"untagged-{stack.table}")["QueueUrl"])
    runtime = switched(stack, agent, backlog_queue_url=backlog, integrity_key_id=None)
    agent.serve(flag(False))

    with lambda_handler.warm.use(runtime), pytest.raises(PausedError):
        lambda_handler.handler(stack.lambda_event(), None)

    assert on_queue(backlog) == []  # the stream delivers the batch again once resumed
    assert kept(stack, item)
