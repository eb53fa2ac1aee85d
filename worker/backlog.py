"""Lambda entry point draining the backlog queue (an SQS event source mapping with ReportBatchItemFailures and a small
``ScalingConfig.MaximumConcurrency``), through the same core as the stream (``cleanup.queues.backlog_drain``).

Each message names a record and the actions it has left (``cleanup.queues.backlog``); the record is cleaned with only
those, the live item read again first as always, at the rate the service allows. A message whose record is not clean yet
is reported (``batchItemFailures``) and released with a growing visibility timeout (a minute, doubling, 12 h at most),
so that it comes back a few times a day at most, and after the queue's maxReceiveCount moves to the backlog's
dead-letter queue. A record that fails permanently goes to DEAD_LETTER_QUEUE_URL as any other, and its message is
done. A message whose integrity tag does not verify, or that cannot be read at all, frees nothing and is moved,
whole, to the backlog's dead-letter queue (``cleanup.queues.backlog_drain``); the rest of its batch goes on. Nothing is
deferred again from here: BACKLOG_QUEUE_URL only names the queue messages are released on. Paused by
the kill switch, or while it is unknown (never read: ``cleanup.killswitch``), every message is
reported and released.
"""

from __future__ import annotations

from typing import Any

from cleanup.deadline import Deadline
from cleanup.killswitch import Mode
from cleanup.queues.backlog_drain import Message, clean, release
from cleanup.runtime import Runtime, WarmRuntime

warm = WarmRuntime()
"""The runtime kept between invocations (``warm.use(runtime)`` hands the handler another)."""


def handler(event: dict[str, Any], context: Any) -> dict[str, list[dict[str, str]]]:
    """Clean what the backlog's messages have left; report the messages that are not done."""
    return drain(event.get("Records") or [], warm.get(), Deadline.from_lambda_context(context))


def drain(messages: list[dict[str, Any]], runtime: Runtime, deadline: Deadline) -> dict[str, list[dict[str, str]]]:
    """Clean the records of SQS messages (``messageId``, ``body``); the partial batch response naming those left."""
    received = [Message.from_lambda(message) for message in messages]
    if runtime.refresh_mode() is Mode.PAUSED:
        runtime.metrics.count("PausedBatches")
        left = received
    else:
        left = clean(received, runtime, deadline)
    release(left, runtime, deadline)
    return {"batchItemFailures": [{"itemIdentifier": message.message_id} for message in left]}
