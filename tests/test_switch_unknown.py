"""A cold start while the kill switch cannot be read (AppConfig or its agent down, or answering garbage): the mode is
unknown, and unknown holds everywhere, durably, until the switch answers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from cleanup.deadline import SAFETY_MARGIN_SECONDS, Deadline
from cleanup.exceptions import PausedError
from tests.agents import ENFORCE, GARBLES, ScriptedAgent, status
from tests.kcl_daemon import KinesisShard
from tests.queues import on_queue
from tests.stack import SessionStack, client
from tests.test_kcl import daemon, deletes  # noqa: F401 (the KCL child fixture)
from tests.test_killswitch import as_sqs, freed, kept, poller, switch_settings, switched
from tests.test_poller import checkpoint
from tests.test_reconcile import age, env, grant_dates  # noqa: F401 (fixtures)
from tests.test_reconcile import session as reconcile_session
from tests.test_sessions import add_expiry_index
from tests.test_sweep import CapturedMetrics, session
from tests.test_sweep import runtime as sweep_runtime
from tests.waiting import wait_for
from worker import backlog as backlog_handler
from worker import cli, lambda_handler
from worker import sweep as sweep_entry
from worker.local.appconfig import LocalAgent


@pytest.fixture
def down() -> Iterator[LocalAgent]:
    """An agent that is not answering yet (``start()`` it to answer, on the same port, with the enforce flag)."""
    agent = LocalAgent().start()
    agent.stop()
    yield agent
    agent.stop()


class Invocation:
    """A Lambda context with ``seconds`` left to run (beside the handler's safety margin)."""

    def __init__(self, seconds: float) -> None:
        self._until = Deadline.after(seconds + SAFETY_MARGIN_SECONDS)

    def get_remaining_time_in_millis(self) -> int:
        return int(self._until.remaining() * 1000)


def ended(stack: SessionStack, session_id: str = "s1") -> dict[str, Any]:
    item = stack.put_session(session_id)
    stack.delete(session_id)
    return item


# Lambda.
@pytest.mark.parametrize("garble", ["a 503", "bad status line", "cut chunked body"])
def test_a_cold_lambda_with_a_backlog_sends_the_batch_there_untouched_and_the_drain_holds_it_too(
    stack: SessionStack, garble: str
) -> None:
    item = ended(stack)
    backlog = str(client("sqs").create_queue(QueueName=f"unknown-{stack.table}")["QueueUrl"])
    sink = CapturedMetrics()

    with ScriptedAgent([GARBLES[garble]]) as agent:
        runtime = switched(stack, agent, sink, backlog_queue_url=backlog)
        with lambda_handler.warm.use(runtime):
            answer = lambda_handler.handler(stack.lambda_event(), Invocation(2))
        messages = on_queue(backlog)
        drain = stack.runtime(**agent.settings(), backlog_queue_url=backlog)
        still = backlog_handler.drain(as_sqs(messages), drain, Deadline.after(30))

    assert answer == {"batchItemFailures": []}  # the stream moves on, no retry spent: the backlog holds the records
    assert [json.loads(body)["remaining"] for body in messages] == [["connection", "grant", "scratch", "registry"]]
    assert len(still["batchItemFailures"]) == 1  # released, not cleaned
    assert kept(stack, item)
    assert sink.values("SwitchUnknown") and sink.values("PausedBatches") == [1]


def test_once_the_switch_answers_the_backlog_is_cleaned(stack: SessionStack, down: LocalAgent) -> None:
    item = ended(stack)
    backlog = str(client("sqs").create_queue(QueueName=f"unknown-{stack.table}")["QueueUrl"])
    runtime = switched(stack, down, backlog_queue_url=backlog)
    with lambda_handler.warm.use(runtime):
        lambda_handler.handler(stack.lambda_event(), Invocation(2))
    messages = on_queue(backlog)

    down.start()
    drained = backlog_handler.drain(as_sqs(messages), runtime, Deadline.after(30))

    assert drained == {"batchItemFailures": []}
    assert freed(stack, item)


def test_a_cold_lambda_without_a_backlog_waits_for_the_switch_then_fails_the_invocation_untouched(
    stack: SessionStack, down: LocalAgent
) -> None:
    item = ended(stack)

    with lambda_handler.warm.use(switched(stack, down)), pytest.raises(PausedError):
        lambda_handler.handler(stack.lambda_event(), Invocation(1))

    assert kept(stack, item)


def test_a_cold_lambda_without_a_backlog_cleans_when_the_switch_answers_within_the_invocation(
    stack: SessionStack,
) -> None:
    item = ended(stack)

    with (
        ScriptedAgent([status(503), status(503), ENFORCE]) as agent,
        lambda_handler.warm.use(stack.runtime(**agent.settings())),
    ):
        answer = lambda_handler.handler(stack.lambda_event(), Invocation(30))

    assert answer == {"batchItemFailures": []}  # no retry spent, nothing held
    assert freed(stack, item)
    assert len(agent.answered) == 3


# The containers.
def test_a_cold_poller_holds_without_a_checkpoint(stack: SessionStack, down: LocalAgent) -> None:
    item = ended(stack)

    summary = poller(stack, down).run(until_idle=True)

    assert summary.paused and summary.records == 0
    assert kept(stack, item) and checkpoint(stack) is None


@pytest.mark.parametrize("garble", ["too many headers", "nested past the parser"])
def test_a_cold_poller_answered_garbage_holds_without_a_checkpoint(stack: SessionStack, garble: str) -> None:
    item = ended(stack)

    with ScriptedAgent([GARBLES[garble]]) as agent:
        summary = poller(stack, agent).run(until_idle=True)

    assert summary.paused and summary.records == 0
    assert kept(stack, item) and checkpoint(stack) is None


def test_a_cold_kcl_processor_holds_its_batch_until_the_switch_answers(stack, down, daemon) -> None:  # noqa: F811
    item = stack.put_session("s1")
    records = deletes(stack, KinesisShard(), "s1")
    child = daemon(**down.env())

    child.post({"action": "processRecords", "records": records, "millisBehindLatest": 0})
    wait_for(lambda: "kill switch unknown: holding" in child.stderr(), "the processor to hold")

    assert kept(stack, item) and child.requests == []
    down.start()
    child.await_status("processRecords")
    assert freed(stack, item)
    assert child.checkpoints == [records[-1]["sequenceNumber"]]


# The scheduled functions.
def test_a_cold_sweeper_deletes_nothing(stack: SessionStack, down: LocalAgent) -> None:
    add_expiry_index(stack)
    session(stack, "old", expires_in=-600)

    with sweep_entry.warm.use(sweep_runtime(stack, **switch_settings(down))):
        answer = sweep_entry.handler({}, None)

    assert answer["paused"] is True
    assert stack.ddb.get_item(TableName=stack.table, Key=stack.key("old"))["Item"]


def test_a_cold_reconcile_frees_nothing(
    env: SessionStack,  # noqa: F811
    down: LocalAgent,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    grant_id = reconcile_session(env, "gone-1")
    env.delete("gone-1")
    age(env, "sessions/t1/gone-1/")
    for name, value in down.env().items():
        monkeypatch.setenv(name, value)

    code = cli.main(["reconcile", "--json"])

    assert code == 1
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["paused"] is True
    assert grant_id in env.grant_ids() and len(env.objects("sessions/t1/gone-1/")) == 2
