"""A dry run set on the kill switch, in a Lambda deployment that enforces, loses none of the records it plans: they
are held as under a pause (the backlog, or the stream), and cleaned once the switch is back to enforce."""

from __future__ import annotations

import json

import pytest

from cleanup.deadline import Deadline
from cleanup.exceptions import PausedError
from tests.queues import on_queue
from tests.stack import SessionStack, client
from tests.test_killswitch import agent, as_sqs, freed, kept, switched  # noqa: F401 (the agent fixture)
from tests.test_sweep import CapturedMetrics
from worker import backlog as backlog_handler
from worker import lambda_handler
from worker.local.appconfig import LocalAgent, flag


def test_a_switch_set_dry_run_holds_the_planned_records_in_the_backlog_until_enforce_cleans_them(
    stack: SessionStack,
    agent: LocalAgent,  # noqa: F811
) -> None:
    item = stack.put_session("planned")
    stack.delete("planned")
    event = stack.lambda_event()
    backlog = str(client("sqs").create_queue(QueueName=f"dry-run-{stack.table}")["QueueUrl"])
    sink = CapturedMetrics()
    runtime = switched(stack, agent, sink, backlog_queue_url=backlog)  # the deployment enforces
    agent.serve(flag(True, "dry-run"))

    with lambda_handler.warm.use(runtime):
        answer = lambda_handler.handler(event, None)
    messages = on_queue(backlog)

    assert answer == {"batchItemFailures": []} and kept(stack, item)  # planned, and held: nothing lost
    assert [json.loads(body)["remaining"] for body in messages] == [["connection", "grant", "scratch", "registry"]]
    assert sum(sink.values("PausedBatches")) == 1 and sum(sink.values("SessionsPlanned")) == 1
    agent.serve(flag(True, "enforce"))
    with backlog_handler.warm.use(runtime):
        assert backlog_handler.drain(as_sqs(messages), runtime, Deadline.after(30)) == {"batchItemFailures": []}
    assert freed(stack, item)


def test_without_a_backlog_a_switch_set_dry_run_leaves_the_batch_in_the_stream(
    stack: SessionStack,
    agent: LocalAgent,  # noqa: F811
) -> None:
    item = stack.put_session("planned")
    stack.delete("planned")
    event = stack.lambda_event()
    agent.serve(flag(True, "dry-run"))

    with lambda_handler.warm.use(switched(stack, agent)):
        with pytest.raises(PausedError, match="set to dry-run while the deployment enforces"):
            lambda_handler.handler(event, None)
        assert kept(stack, item)
        agent.serve(flag(True, "enforce"))
        answer = lambda_handler.handler(event, None)  # the mapping delivers the batch again

    assert answer == {"batchItemFailures": []} and freed(stack, item)


def test_a_dry_run_deployment_is_not_held_by_a_switch_set_dry_run(
    stack: SessionStack,
    agent: LocalAgent,  # noqa: F811
) -> None:
    item = stack.put_session("rollout")
    stack.delete("rollout")
    agent.serve(flag(True, "dry-run"))

    with lambda_handler.warm.use(switched(stack, agent, cleanup_mode="dry-run")):
        answer = lambda_handler.handler(stack.lambda_event(), None)

    assert answer == {"batchItemFailures": []} and kept(stack, item)  # the deployment's own mode: a rollout
