"""A Lambda event source mapping on one shard, simulated around the real handler: the calibration harness.

``deliver`` hands a burst of stream records to a handler in batches as the mapping does with ReportBatchItemFailures:
after a partial failure it resumes from the lowest failed sequence number (successes after it delivered again); a
batch retried more than MaximumRetryAttempts times, or records older than MaximumRecordAgeInSeconds (every record of
the burst arrived when delivery started), go to the on-failure destination as the mapping sends them: the shard and
the sequence range only, never the records. Each invocation gets a context whose remaining time counts down from the
function's timeout in real time. Bisecting never happens: the worker answers before its timeout.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Invoke = Callable[[dict[str, Any], Any], dict[str, Any]]


@dataclass(frozen=True)
class MappingSettings:
    """The mapping's settings that decide a burst's fate (scaled down for a run on one machine)."""

    batch_size: int = 100
    timeout: float = 8.0
    retry_attempts: int = -1
    record_age: float = -1.0


@dataclass
class Delivered:
    """What the mapping did: when the shard was through, how many invocations, what went to the on-failure queue."""

    seconds: float = 0.0
    invocations: int = 0
    redelivered: int = 0
    discarded: int = 0
    messages: int = 0


class Context:
    """A Lambda context whose remaining time counts down from ``seconds`` in real time."""

    def __init__(self, seconds: float) -> None:
        self.ends_at = time.monotonic() + seconds

    def get_remaining_time_in_millis(self) -> int:
        return int((self.ends_at - time.monotonic()) * 1000)


def sequence(record: dict[str, Any]) -> str:
    return str(record["dynamodb"]["SequenceNumber"])


def on_failure_message(records: list[dict[str, Any]], stream_arn: str, condition: str) -> str:
    """The on-failure destination's message for a discarded batch: metadata only, as Lambda sends it."""
    return json.dumps(
        {
            "requestContext": {"condition": condition, "approximateInvokeCount": 1},
            "version": "1.0",
            "DDBStreamBatchInfo": {
                "shardId": "shardId-00000001",
                "startSequenceNumber": sequence(records[0]),
                "endSequenceNumber": sequence(records[-1]),
                "batchSize": len(records),
                "streamArn": stream_arn,
            },
        }
    )


def deliver(
    records: list[dict[str, Any]],
    invoke: Invoke,
    settings: MappingSettings,
    discard: Callable[[list[dict[str, Any]], str], None],
) -> Delivered:
    """Deliver a burst of records through ``invoke`` until every one is through (cleaned, or discarded)."""
    done = Delivered()
    started = time.monotonic()
    position, attempts = 0, 0

    def drop(chunk: list[dict[str, Any]], condition: str) -> None:
        for at in range(0, len(chunk), settings.batch_size):
            discard(chunk[at : at + settings.batch_size], condition)
            done.messages += 1
        done.discarded += len(chunk)

    while position < len(records):
        if 0 <= settings.record_age < time.monotonic() - started:
            drop(records[position:], "RecordAgeExceeded")
            break
        batch = records[position : position + settings.batch_size]
        answer = invoke({"Records": batch}, Context(settings.timeout))
        done.invocations += 1
        failed = {failure["itemIdentifier"] for failure in answer["batchItemFailures"]}
        if not failed:
            position, attempts = position + len(batch), 0
            continue
        first = [sequence(record) for record in batch].index(min(failed, key=int))
        done.redelivered += len(batch) - first
        position, attempts = position + first, attempts + 1
        if 0 <= settings.retry_attempts < attempts:
            drop(batch[first:], "RetryAttemptsExhausted")
            position, attempts = position + len(batch) - first, 0
    done.seconds = time.monotonic() - started
    return done


def drain_queue(
    sqs: Any,
    queue: str,
    invoke: Invoke | Sequence[Invoke],
    *,
    timeout: float,
    concurrency: int,
    stream_done: Callable[[], bool],
    retry_after: float = 2.0,
) -> float:
    """Drain an SQS queue as an SQS event source mapping with ReportBatchItemFailures and MaximumConcurrency does,
    until the stream is through and the queue is empty; returns when it was empty (seconds from the call).

    ``invoke``: one function for every invocation, or one per invocation at once (``concurrency`` of them): Lambda
    runs concurrent invocations in environments of their own, each with its own process and learnt rates."""
    import threading

    started = time.monotonic()
    emptied = [0.0]
    invokers = [invoke] * concurrency if callable(invoke) else list(invoke)

    def poll(invoke: Invoke) -> None:
        while True:
            answer = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1)
            messages = answer.get("Messages", [])
            if not messages:
                if stream_done() and _empty(sqs, queue):
                    return
                continue
            event = {"Records": [{"messageId": m["MessageId"], "body": m["Body"]} for m in messages]}
            failed = {f["itemIdentifier"] for f in invoke(event, Context(timeout))["batchItemFailures"]}
            for message in messages:
                if message["MessageId"] in failed:  # visible again after a while: the queue's visibility timeout
                    sqs.change_message_visibility(
                        QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=int(retry_after)
                    )
                else:
                    sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
            emptied[0] = max(emptied[0], time.monotonic() - started)

    threads = [threading.Thread(target=poll, args=(invokers[index],)) for index in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return emptied[0]


def _empty(sqs: Any, queue: str) -> bool:
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attributes = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=names)["Attributes"]
    return all(int(attributes[name]) == 0 for name in names)
