"""A warning while there is still time: the age of the oldest waiting record, published by the consumer, warned
about in its log and its health check past 12 hours, and unhealthy past 20, before the stream's 24 hours run out.

moto dates a stream record at its write: the records are dated back in moto's own backend (``backdate``)."""

from __future__ import annotations

import threading
from typing import Any

from cleanup.streams.poller import StreamPoller
from tests.test_killswitch import switched
from tests.test_poller import FakeTime
from tests.test_poller_latest import backdate
from tests.test_poller_stream import health_says
from tests.test_sweep import CapturedMetrics
from tests.waiting import WAIT_GUARD_SECONDS, wait_for
from worker.local.appconfig import LocalAgent, flag

METRIC = "OldestRecordAgeSeconds"


def test_the_thresholds_are_12_and_20_hours_of_a_days_retention() -> None:
    from cleanup.streams.record_age import thresholds

    assert thresholds(24 * 3600) == (12 * 3600, 20 * 3600)


def paused_poller(stack: Any, agent: LocalAgent, sink: CapturedMetrics, fake: FakeTime | None, **settings: Any) -> Any:
    agent.serve(flag(False))
    runtime = switched(stack, agent, sink, checkpoint_table=f"ckpt-{stack.table}", **settings)
    if fake is None:  # in a thread of its own, on the real clock
        return StreamPoller(runtime, stack.stream_arn)
    return StreamPoller(runtime, stack.stream_arn, clock=fake.clock, sleep=fake.sleep)


def test_a_paused_poller_publishes_and_warns_of_a_record_waiting_for_13_hours(stack, caplog):
    stack.put_session("s1")
    stack.delete("s1")
    backdate(stack, hours=13)
    sink = CapturedMetrics()

    with LocalAgent() as agent:
        summary = paused_poller(stack, agent, sink, FakeTime()).run(until_idle=True)

    assert summary.paused
    ages = sink.values(METRIC)
    assert ages and 13 * 3600 <= ages[-1] < 14 * 3600
    [warning] = [r for r in caplog.records if "the oldest waiting record is 13.0 h old" in r.getMessage()]
    assert warning.levelname == "WARNING"


def test_a_poller_paused_past_20_hours_of_waiting_fails_its_health_check(stack, tmp_path, monkeypatch, capsys):
    stack.put_session("s1")
    stack.delete("s1")
    backdate(stack, hours=21)
    health_file = str(tmp_path / "health")
    with LocalAgent() as agent:
        poller = paused_poller(stack, agent, CapturedMetrics(), None, health_file=health_file)
        thread = threading.Thread(target=poller.run, daemon=True)
        thread.start()
        said: list[str] = []
        try:
            # Before the poller's first beat, the check is unhealthy for another reason (no health file yet): wait for
            # the poller's own word on the age.
            wait_for(
                lambda: said.append(health_says(stack, tmp_path, monkeypatch, capsys)) or "record" in said[-1],
                "the health check's word on the waiting record",
            )
        finally:
            poller.request_stop()
            thread.join(WAIT_GUARD_SECONDS)

    assert said[-1].startswith("unhealthy: the poller: the oldest waiting record is 21.0 h old")
