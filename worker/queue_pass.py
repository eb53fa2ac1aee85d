"""One pass over an SQS queue, for the commands an operator runs on a queue (``redrive``, ``retag``): every message
received once, and the ones kept made visible again at the end."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cleanup.aws.calls import call
from cleanup.exceptions import CleanupError

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient


@dataclass(frozen=True, slots=True)
class Received:
    """A message as received: its id, body, receipt handle and message attributes (each read defensively: a message
    without a receipt handle can be neither deleted nor released, and is only reported)."""

    message_id: str
    body: str
    receipt: str
    attributes: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, message: Any) -> Received:
        attributes = message.get("MessageAttributes")
        return cls(
            str(message.get("MessageId") or "?"),
            str(message.get("Body") or ""),
            str(message.get("ReceiptHandle") or ""),
            dict(attributes) if isinstance(attributes, dict) else {},
        )


def messages(sqs: SQSClient, queue_url: str, wait_seconds: int, *, attributes: bool = False) -> Iterator[Received]:
    """Every message on the queue once: stops at the first receive that brings none not already seen.

    ``attributes``: also receive each message's attributes (to send it again as it was).
    """
    seen: set[str] = set()
    extra: dict[str, Any] = {"MessageAttributeNames": ["All"]} if attributes else {}
    while True:
        answer = call(
            sqs.receive_message,
            "ReceiveMessage",
            None,
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=wait_seconds,
            **extra,
        )
        fresh = [Received.of(m) for m in answer.get("Messages", [])]
        fresh = [m for m in fresh if m.message_id not in seen]
        if not fresh:
            return
        for message in fresh:
            seen.add(message.message_id)
            yield message


def release(sqs: SQSClient, queue_url: str, receipts: list[str]) -> None:
    """Make the kept messages visible again now, so that the next run (or a person) sees them at once. A failure here
    is harmless: the message becomes visible anyway when its visibility timeout ends."""
    for receipt in receipts:
        if not receipt:
            continue
        with contextlib.suppress(CleanupError):
            call(
                sqs.change_message_visibility,
                "ChangeMessageVisibility",
                None,
                QueueUrl=queue_url,
                ReceiptHandle=receipt,
                VisibilityTimeout=0,
            )


def depth(sqs: SQSClient, queue_url: str) -> int | None:
    """How many messages the queue holds, for a progress bar's ETA (None if it cannot be asked)."""
    try:
        answer = call(
            sqs.get_queue_attributes,
            "GetQueueAttributes",
            None,
            QueueUrl=queue_url,
            AttributeNames=["ApproximateNumberOfMessages"],
        )
    except CleanupError:
        return None
    found = str(answer.get("Attributes", {}).get("ApproximateNumberOfMessages", ""))
    return int(found) if found.isdigit() else None
