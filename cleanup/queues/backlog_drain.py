"""Draining the backlog queue: the core of the Lambda drain (``worker.backlog``) and the container's (``cleanup-worker
drain``).

A message names a record and the actions it has left (``cleanup.queues.backlog``). :func:`clean` runs those through the
same core as the stream (``run_batch``: the live item read again before every destructive call, at the learnt rate) and
returns the messages that are not done. A message is done when its record is clean, or dead-lettered for good; a
dry run (the kill switch turned to dry-run while messages wait) plans and leaves every message for later. A record
stored in S3 (the claim-check) has its object deleted once it is clean (``claim_check.delete_stored``, which checks
the location against DEAD_LETTER_BUCKET / DEAD_LETTER_PREFIX first, and leaves a "redriven" marker): a duplicate
message that then finds the object gone and the marker there is done too.

A drain process that has learnt no rate for a service starts at its share of the lowest its batch's messages carry
(``pace``: what the deferring worker learnt; ``Pacer.seed``), not with a burst into a quota its sender found spent.
Its share is one of BACKLOG_MAXIMUM_CONCURRENCY: Lambda runs that many drain invocations at once, each in an
environment of its own that learns the quota apart, and each taking the sender's whole rate would together start at
twice the quota (with the default of two), where the one a token bucket happens to serve first takes nearly all of it
and the other is cut to its floor and throttled there.

Before anything else each message's integrity tag is verified (``cleanup.queues.integrity``), and a stored record's
bytes against the digest the tag covers. A message that fails it, or that cannot be read at all (any JSON, any type in
any field), is refused alone: counted (``MessagesRefused``), logged, and moved whole to the backlog's dead-letter queue
(its RedrivePolicy's target; with none, it stays in the backlog); it frees nothing, and the other messages of its
batch go on. A message written before INTEGRITY_KEY_ID was set is untagged and refused the same way: drain the backlog
before the upgrade, or redrive what reaches the dead-letter queue by hand after checking it.

A message not done is released with a growing visibility timeout (:func:`release_seconds`: a minute, doubling, at
most 12 h), so that a message failing for days is received a few dozen times, not thousands: the queue's
maxReceiveCount then moves it to the backlog's dead-letter queue while most of its 14 days are left.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cleanup.aws.answers import needed
from cleanup.aws.calls import call
from cleanup.deadline import Deadline
from cleanup.exceptions import CleanupError, IntegrityError, MessageFormatError
from cleanup.queues.backlog import load_message, only_remaining, pace_hint, split_remaining
from cleanup.queues.claim_check import Settled, StoredRecord, delete_stored, read_stored, settled
from cleanup.queues.integrity import DIGEST_FIELD
from cleanup.queues.integrity_check import refused, verify
from cleanup.queues.reporting import run_batch
from cleanup.queues.unconfigured import report_unknown
from cleanup.telemetry import log
from schemas.outcomes import Outcome, Status
from schemas.records import RecordError, StreamRecord, UnreadableRecord, read_record
from schemas.settings import CleanupMode

if TYPE_CHECKING:
    from mypy_boto3_sqs.type_defs import ChangeMessageVisibilityBatchRequestEntryTypeDef

    from cleanup.runtime import Runtime

RELEASE_FIRST_SECONDS = 60
RELEASE_MAX_SECONDS = 43_200  # SQS's longest visibility timeout
SQS_BATCH = 10


@dataclass(frozen=True, slots=True)
class Message:
    """One backlog message as received: from a Lambda SQS event or from ReceiveMessage."""

    message_id: str
    body: str
    receipt_handle: str
    receives: int = 1

    @classmethod
    def from_lambda(cls, record: dict[str, Any]) -> Message:
        """A record of a Lambda SQS event (``messageId``, ``body``, ``receiptHandle``, ``attributes``)."""
        attributes = record.get("attributes") or {}
        return cls(
            str(record.get("messageId")),
            str(record.get("body", "")),
            str(record.get("receiptHandle", "")),
            _count(attributes.get("ApproximateReceiveCount")),
        )

    @classmethod
    def from_sqs(cls, message: dict[str, Any]) -> Message:
        """A message of a ReceiveMessage answer (asked with the ApproximateReceiveCount attribute)."""
        attributes = message.get("Attributes") or {}
        return cls(
            str(message.get("MessageId")),
            str(message.get("Body", "")),
            str(message.get("ReceiptHandle", "")),
            _count(attributes.get("ApproximateReceiveCount")),
        )


def _count(value: Any) -> int:
    try:
        return max(1, int(value))
    except (TypeError, ValueError):
        return 1


def release_seconds(receives: int) -> int:
    """How long a message received ``receives`` times, and not done, stays hidden: a minute, doubling, 12 h at most."""
    return int(min(RELEASE_MAX_SECONDS, RELEASE_FIRST_SECONDS * 2 ** min(max(receives, 1) - 1, 16)))


def clean(messages: Sequence[Message], runtime: Runtime, deadline: Deadline) -> list[Message]:
    """Clean what each message has left; returns the messages not done (to report, or to release).

    A message refused (its tag, or its shape) is moved to the backlog's dead-letter queue and counts as done.
    """
    left: list[Message] = []
    bad: list[tuple[Message, str]] = []
    read: list[tuple[Message, StreamRecord | UnreadableRecord, StoredRecord | None, list[str]]] = []
    paces: dict[str, float] = {}
    for message, result in zip(messages, _read_all(messages, runtime, deadline), strict=True):
        if isinstance(result, IntegrityError):
            bad.append((message, f"integrity: {result}"))
        elif isinstance(result, MessageFormatError | RecordError):
            bad.append((message, f"unreadable: {result}"))
        elif isinstance(result, CleanupError):
            log.error(
                "backlog message not readable now; kept", extra={"messageId": message.message_id, "error": str(result)}
            )
            left.append(message)
        elif isinstance(result, Exception):  # the per-message boundary: whatever the message holds, it fails alone
            bad.append((message, f"unreadable: {type(result).__name__}: {result}"))
        else:
            found, carried = result
            for service, pace in carried.items():
                paces[service] = min(pace, paces.get(service, pace))
            if found is not None:
                read.append((message, *found))
    left += quarantine(bad, runtime, deadline)
    share = runtime.settings.backlog_maximum_concurrency
    runtime.clients.pacer.seed({service: pace / share for service, pace in paces.items()})
    outcomes = run_batch([record for _, record, _, _ in read], runtime, deadline, backlog=False) if read else []
    cleaned = [
        (outcome, record, unknown if _done(outcome) else [])
        for (_, record, _, unknown), outcome in zip(read, outcomes, strict=True)
    ]
    reported = report_unknown(cleaned, runtime, deadline)  # kinds no longer in ACTIONS: each its own failure
    for (message, _, stored, _), outcome, done in zip(read, outcomes, reported, strict=True):
        if not done or not _done(outcome) or (stored is not None and not _forget(runtime, stored, outcome)):
            left.append(message)
    return left


_Found = tuple[StreamRecord | UnreadableRecord, StoredRecord | None, list[str]]  # and the kinds not in ACTIONS
_Read = tuple[_Found | None, dict[str, float]]  # the record and its stored object (None: done), the sender's rates


def _read_all(messages: Sequence[Message], runtime: Runtime, deadline: Deadline) -> list[_Read | Exception]:
    """Each message read (``_read``: its record and the rates its sender learnt), or what it raised, in order.

    Concurrently on the runtime's pool, free until the batch is cleaned: each message costs a KMS call (its tag), and an
    S3 read for a stored record; one after the other, they held back a batch's first grant by a call's time for each
    message before it (a second for ten, on moto)."""

    def one(message: Message) -> _Read | Exception:
        try:
            return _read(message, runtime, deadline)
        except Exception as exc:  # sorted by the caller: refused, kept, or failed alone
            return exc

    return list(runtime.executor.map(one, messages))


def _done(outcome: Outcome) -> bool:
    if outcome.status is Status.PLANNED:
        return False  # a dry run changed nothing: the message waits for enforce
    return not outcome.failed or outcome.dead_lettered


def _forget(runtime: Runtime, stored: StoredRecord, outcome: Outcome) -> bool:
    """Delete a clean record's stored object; False (the message stays, to try again) if it could not be."""
    if outcome.dead_lettered:
        return True  # its dead-letter message names the object: redrive deletes it
    try:
        delete_stored(runtime, stored)
    except CleanupError as exc:
        log.warning("stored backlog record not deleted; the message stays", extra={"error": str(exc)})
        log.debug("stored backlog record not deleted", extra={"object": str(stored)})
        return False
    return True


def _read(message: Message, runtime: Runtime, deadline: Deadline) -> _Read:
    """The message's record, cut to its actions left, and its stored object if any (None: a duplicate, done); and the
    rates its sender learnt (``pace``), read once its tag is verified.

    Raises:
        IntegrityError / MessageFormatError / RecordError: refused (the message is moved, whole, for an operator).
        CleanupError: it cannot be read now (the message is kept).
    """
    body = load_message(message.body)
    verify(body, runtime, deadline)  # before anything it names is read, let alone freed
    remaining, unknown = split_remaining(body, [kind.name for kind in runtime.kind_classes])
    paces = pace_hint(body)
    stored = None
    location = body.get("recordObject")
    if isinstance(location, dict):  # the claim-check: only DEAD_LETTER_BUCKET / PREFIX, checked by read_stored
        number, version = body.get("sequenceNumber"), location.get("versionId")
        stored = StoredRecord(
            str(location.get("bucket")),
            str(location.get("key")),
            version if isinstance(version, str) and version else None,
            number if isinstance(number, str) else None,
            digest=body.get(DIGEST_FIELD),
        )
        whole = read_stored(runtime, stored)
        if whole is None:
            if settled(runtime, stored) is Settled.REDRIVEN:
                return None, paces  # an earlier message of the same record cleaned it and deleted the object
            raise CleanupError(f"the backlog message's stored record {stored} is missing")
        body = {**whole, "remaining": remaining}
    raw = body.get("record")
    if not isinstance(raw, dict):
        raise CleanupError("the backlog message holds no record")
    record = read_record(only_remaining(raw, remaining, runtime.settings.attributes, runtime.kind_classes))
    return (record, stored, unknown), paces


def quarantine(bad: Sequence[tuple[Message, str]], runtime: Runtime, deadline: Deadline) -> list[Message]:
    """Move refused messages, whole, to the backlog's dead-letter queue; returns those that could not be moved (they
    stay in the backlog, released as any other, and reach it by maxReceiveCount)."""
    if not bad:
        return []
    if runtime.settings.cleanup_mode is CleanupMode.DRY_RUN:  # a dry run moves nothing either: counted, and kept
        for message, why in bad:
            refused(runtime, message.message_id, why.split(":", 1)[0], why, "the backlog (dry run)")
        return [message for message, _ in bad]
    try:
        target = dead_letter_target(runtime, deadline)
    except CleanupError as exc:
        target = None
        log.warning("the backlog's dead-letter queue is unknown now", extra={"error": str(exc)})
    kept = []
    for message, why in bad:
        moved = target is not None and _send(runtime, target, message, why, deadline)
        refused(
            runtime,
            message.message_id,
            why.split(":", 1)[0],
            why,
            "the backlog's dead-letter queue" if moved else "the backlog",
        )
        if not moved:
            kept.append(message)
    return kept


def dead_letter_target(runtime: Runtime, deadline: Deadline | None) -> str | None:
    """The URL of the backlog's dead-letter queue, from its RedrivePolicy (None: it has none).

    Raises:
        TransientError / PermanentError: SQS could not say now (or answered without the queue's URL).
    """
    sqs, queue = runtime.clients.sqs, runtime.settings.backlog_queue_url
    if not queue:
        return None
    answer = call(
        sqs.get_queue_attributes, "GetQueueAttributes", deadline, QueueUrl=queue, AttributeNames=["RedrivePolicy"]
    )
    try:
        arn = str(json.loads(answer.get("Attributes", {})["RedrivePolicy"])["deadLetterTargetArn"])
    except (KeyError, TypeError, ValueError):
        return None
    parts = arn.split(":")
    if len(parts) != 6:
        return None
    account, name = parts[4], parts[5]
    found = call(sqs.get_queue_url, "GetQueueUrl", deadline, QueueName=name, QueueOwnerAWSAccountId=account)
    return str(needed(found, "GetQueueUrl", "QueueUrl", kind=str))


def _send(runtime: Runtime, queue: str, message: Message, why: str, deadline: Deadline) -> bool:
    try:
        call(
            runtime.clients.sqs.send_message,
            "SendMessage",
            deadline,
            QueueUrl=queue,
            MessageBody=message.body,
            MessageAttributes={"refusedBecause": {"DataType": "String", "StringValue": why[:1000]}},
        )
    except CleanupError as exc:
        log.warning("a refused message could not be moved; it stays in the backlog", extra={"error": str(exc)})
        return False
    return True


def release(messages: Sequence[Message], runtime: Runtime, deadline: Deadline | None = None) -> None:
    """Hide the messages not done for :func:`release_seconds` (a failure only leaves the queue's own timeout)."""
    queue = runtime.settings.backlog_queue_url
    for start in range(0, len(messages) if queue else 0, SQS_BATCH):
        entries: list[ChangeMessageVisibilityBatchRequestEntryTypeDef] = [
            {"Id": str(i), "ReceiptHandle": m.receipt_handle, "VisibilityTimeout": release_seconds(m.receives)}
            for i, m in enumerate(messages[start : start + SQS_BATCH])
        ]
        try:
            call(
                runtime.clients.sqs.change_message_visibility_batch,
                "ChangeMessageVisibilityBatch",
                deadline,
                QueueUrl=str(queue),
                Entries=entries,
            )
        except CleanupError as exc:
            log.warning(
                "backlog messages not released; they return after the queue's timeout", extra={"error": str(exc)}
            )
