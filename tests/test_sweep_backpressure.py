"""Sweeper backpressure: a sweep deletes no faster than cleanup absorbs, and its summary says why it held back."""

from __future__ import annotations

from cleanup.expiry.sweeper import Verdict, sweep
from tests.stack import SessionStack, client
from tests.test_sessions import get
from tests.test_sweep import indexed, runtime, session

__all__ = ["indexed"]  # the fixture, used by name


def backlog_holding(stack: SessionStack, messages: int) -> str:
    url = str(client("sqs").create_queue(QueueName=f"backlog-sweep-{stack.table}")["QueueUrl"])
    for n in range(messages):
        client("sqs").send_message(QueueUrl=url, MessageBody=f"waiting {n}")
    return url


def test_a_sweep_deletes_at_most_sweep_max_deletes_and_defers_the_rest(indexed: SessionStack) -> None:
    for n in range(5):
        session(indexed, f"old{n}", expires_in=-10 - n)

    report = sweep(runtime(indexed, sweep_max_deletes=2))

    left = [n for n in range(5) if get(indexed, f"old{n}") is not None]
    assert len(left) == 3
    assert (report.verdicts[Verdict.SWEPT], report.verdicts[Verdict.DEFERRED]) == (2, 3)
    assert report.summary()["backpressure"] == "SWEEP_MAX_DELETES 2 reached: the rest wait"
    assert sweep(runtime(indexed, sweep_max_deletes=2)).verdicts[Verdict.SWEPT] == 2  # the next sweep goes on


def test_a_backlog_over_sweep_max_backlog_stops_every_delete(indexed: SessionStack) -> None:
    session(indexed, "old", expires_in=-30)
    queue = backlog_holding(indexed, 3)

    report = sweep(runtime(indexed, backlog_queue_url=queue, sweep_max_backlog=2))

    assert get(indexed, "old") is not None
    assert report.verdicts[Verdict.DEFERRED] == 1 and report.verdicts[Verdict.SWEPT] == 0
    assert "the backlog holds 3 messages, over SWEEP_MAX_BACKLOG 2" in report.summary()["backpressure"]


def test_a_backlog_within_sweep_max_backlog_lets_the_sweep_delete(indexed: SessionStack) -> None:
    session(indexed, "old", expires_in=-30)
    queue = backlog_holding(indexed, 2)

    report = sweep(runtime(indexed, backlog_queue_url=queue, sweep_max_backlog=2))

    assert get(indexed, "old") is None
    assert report.verdicts[Verdict.SWEPT] == 1 and "backpressure" not in report.summary()


def test_a_backlog_whose_depth_cannot_be_read_stops_every_delete(indexed: SessionStack) -> None:
    session(indexed, "old", expires_in=-30)
    missing = backlog_holding(indexed, 0) + "-gone"

    report = sweep(runtime(indexed, backlog_queue_url=missing, sweep_max_backlog=10))

    assert get(indexed, "old") is not None
    assert report.summary()["backpressure"].startswith("the backlog's depth is unknown")
