"""The dead-letter queue: where records that failed permanently go, whole, with their error.

A record is only taken off the failure list once SQS has accepted it; if the send fails the record stays failed and
is reported, so it is retried instead of lost.

Sizes: a message may be as large as the queue's MaximumMessageSize (asked once per process), and one
SendMessageBatch carries at most 10 messages and 1 MiB in all, so batches are made by bytes. A body is ASCII JSON
(non-ASCII escaped, so always valid SQS text), and its size is its UTF-8 length. A record whose message would be
too large (escaping can triple an item's 400 KB) is stored as an S3 object under DEAD_LETTER_PREFIX in
DEAD_LETTER_BUCKET, and the message names it (``cleanup.queues.stored_records``).

Every message sent carries an integrity tag (``cleanup.queues.integrity``: a KMS HMAC over its whole content, the stored
record's digest included), checked by the drain and redrive before they free anything it names. A record's images
are cut to its keys and session attributes first (``cleanup.queues.record_image``): the rest of the item never leaves
the table. The object's key (it holds the sequence number) is logged at DEBUG only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cleanup.aws.calls import call
from cleanup.aws.retry import call_with_retry
from cleanup.deadline import Deadline
from cleanup.exceptions import CleanupError
from cleanup.queues.integrity import TAG_BYTES, digest, seal
from cleanup.queues.record_image import needed_only
from cleanup.queues.stored_records import OBJECT_KEY as OBJECT_KEY
from cleanup.queues.stored_records import SHORT_ERROR as SHORT_ERROR
from cleanup.queues.stored_records import is_object_key as is_object_key
from cleanup.queues.stored_records import message_size as message_size
from cleanup.queues.stored_records import object_key, pointer_body, put_record
from cleanup.telemetry import log
from schemas.outcomes import Outcome
from schemas.records import StreamRecord, UnreadableRecord, record_id, split_record_id
from schemas.settings import AttributeNames, CleanupMode

if TYPE_CHECKING:
    from mypy_boto3_sqs.type_defs import SendMessageBatchRequestEntryTypeDef

    from cleanup.runtime import Runtime

SQS_BATCH = 10
SQS_BATCH_BYTES = 1_048_576  # SendMessageBatch: the sum of its messages' sizes
MESSAGE_FORMAT = "session-cleanup.dead-letter.v1"


def message_body(
    outcome: Outcome,
    record: StreamRecord | UnreadableRecord,
    attempts: int = 1,
    *,
    names: AttributeNames | None = None,
    own: tuple[str, ...] = (),
) -> str:
    """The dead-letter message (untagged): the record with only the attributes cleaning needs (``names``: the
    default ones when not given; ``own``: the enabled kinds' own attributes), why it failed, and after how many
    tries.

    The record's id is split into ``sequenceNumber`` and, for a record de-aggregated by the KCL,
    ``subSequenceNumber`` (``schemas.records.record_id``): the sequence number is the stream's own.
    """
    source = record.source.value if isinstance(record, StreamRecord) else None
    number, sub = split_record_id(outcome.sequence_number)
    return json.dumps(
        {
            "format": MESSAGE_FORMAT,
            "sequenceNumber": number,
            **({"subSequenceNumber": sub} if sub is not None else {}),
            "eventID": outcome.event_id,
            "source": source,
            "error": outcome.error,
            "attempts": attempts,
            "actions": [a.model_dump(mode="json") for a in outcome.actions],
            "failedAt": int(time.time()),
            "record": needed_only(record.raw, names or AttributeNames(), own),
        },
        default=str,
    )


def message_record_id(message: dict[str, Any]) -> str | None:
    """The id of the record a dead-letter message carries (``sequenceNumber`` and ``subSequenceNumber``), if any."""
    number, sub = message.get("sequenceNumber"), message.get("subSequenceNumber")
    if not isinstance(number, str):
        return None
    return record_id(number, sub if isinstance(sub, int) and not isinstance(sub, bool) and sub > 0 else None)


def dead_letter(
    outcomes: list[Outcome],
    records: Sequence[StreamRecord | UnreadableRecord],
    runtime: Runtime,
    only: Collection[str] | None = None,
    attempts: Mapping[str, int] | None = None,
    *,
    deadline: Deadline | None = None,
) -> list[Outcome]:
    """Send permanent failures to DEAD_LETTER_QUEUE_URL (when set); returns outcomes marked ``dead_lettered``.

    ``only`` names instead the failures to send, permanent or not (the records a consumer gives up on); ``attempts``
    says how many times each record was tried (once when not given). A dry run sends nothing. Once ``deadline`` has
    passed no further call is made: the records not sent yet stay failed and are reported.
    """
    queue = runtime.settings.dead_letter_queue_url
    pending = [
        i
        for i, outcome in enumerate(outcomes)
        if outcome.failed and (outcome.permanent if only is None else outcome.sequence_number in only)
    ]
    if not queue or not pending or runtime.settings.cleanup_mode is CleanupMode.DRY_RUN:
        return outcomes
    deadline = deadline or Deadline()
    try:  # a slow or throttled queue is waited for, within the deadline, as every other call is
        limit = call_with_retry(lambda: runtime.message_limit(queue, deadline), runtime.settings, deadline)
    except CleanupError as exc:
        log.error("dead-letter queue's message size unknown; the records stay failed", extra={"error": str(exc)})
        return outcomes
    letters = _letters(pending, outcomes, records, attempts or {}, runtime, limit, deadline)
    result = list(outcomes)
    requests = list(batches(letters))
    for number, batch in enumerate(requests):
        if deadline.remaining() <= 0:
            _out_of_time([letter for unsent in requests[number:] for letter in unsent])
            break
        for index in send_batch(runtime, queue, batch, deadline):
            result[index] = outcomes[index].model_copy(update={"dead_lettered": True})
    return result


@dataclass(frozen=True, slots=True)
class Letter:
    """One message to send: the record's index in the batch, the body, and the object holding it if it is stored."""

    index: int
    body: str
    stored: str | None = None

    @property
    def size(self) -> int:
        return message_size(self.body)


def batches(letters: Sequence[Letter]) -> Iterator[list[Letter]]:
    """The letters in SendMessageBatch requests, in order: at most 10 messages and 1 MiB each."""
    batch: list[Letter] = []
    total = 0
    for letter in letters:
        if batch and (len(batch) == SQS_BATCH or total + letter.size > SQS_BATCH_BYTES):
            yield batch
            batch, total = [], 0
        batch.append(letter)
        total += letter.size
    if batch:
        yield batch


def _letters(
    pending: list[int],
    outcomes: list[Outcome],
    records: Sequence[StreamRecord | UnreadableRecord],
    attempts: Mapping[str, int],
    runtime: Runtime,
    limit: int,
    deadline: Deadline,
) -> list[Letter]:
    names = runtime.settings.attributes
    bodies = [
        (
            index,
            message_body(
                outcomes[index],
                records[index],
                attempts.get(outcomes[index].sequence_number, 1),
                names=names,
                own=runtime.shape.extra,
            ),
        )
        for index in pending
    ]
    return letters_for(bodies, runtime, limit, deadline)


def letters_for(bodies: Sequence[tuple[int, str]], runtime: Runtime, limit: int, deadline: Deadline) -> list[Letter]:
    """The letters carrying ``bodies`` (record index, message body), in order, without those that could not be made.

    Each letter costs a KMS call (its tag), so they are made concurrently on the runtime's pool, free again once the
    batch has been cleaned: one after the other, a hundred deferred records took most of an invocation to tag.
    """

    def made(item: tuple[int, str]) -> Letter | None:
        index, body = item
        return letter(index, body, runtime, limit, deadline) if deadline.remaining() > 0 else None

    return [result for result in runtime.executor.map(made, bodies) if result is not None]


def letter(index: int, body: str, runtime: Runtime, limit: int, deadline: Deadline) -> Letter | None:
    """The tagged message carrying ``body``, or, when too large, naming where it is stored (None: it stays failed)."""
    about = {"sequenceNumber": json.loads(body).get("sequenceNumber")}
    if message_size(body) + TAG_BYTES > limit:
        if deadline.remaining() <= 0:
            log.error("out of time to store a dead-letter record; it stays failed", extra=about)
            return None
        return stored_letter(index, body, runtime, limit, deadline)
    try:
        return Letter(index, call_with_retry(lambda: seal(body, runtime, deadline), runtime.settings, deadline))
    except CleanupError as exc:
        log.error("could not tag a message for its queue; the record stays failed", extra={**about, "error": str(exc)})
        return None


def stored_letter(index: int, body: str, runtime: Runtime, limit: int, deadline: Deadline) -> Letter | None:
    """Store the whole message in S3 and return the message that names it (None: the record stays failed)."""
    message = json.loads(body)
    settings = runtime.settings
    about = {"sequenceNumber": message.get("sequenceNumber"), "bytes": message_size(body), "limit": limit}
    bucket = settings.dead_letter_store
    if not bucket:
        log.error("record too large for a dead-letter message and no DEAD_LETTER_BUCKET to store it", extra=about)
        return None
    key = object_key(settings.dead_letter_prefix, str(message.get("sequenceNumber")))
    try:
        location = call_with_retry(
            lambda: put_record(runtime.clients.s3, bucket, key, body, deadline), settings, deadline
        )
        untagged = pointer_body(message, location, limit - TAG_BYTES, digest(body.encode("utf-8")))
        if untagged is None:
            log.error("even the message naming a stored record is too large; it stays failed", extra=about)
            return None
        pointer = call_with_retry(lambda: seal(untagged, runtime, deadline), settings, deadline)
    except CleanupError as exc:
        log.error("could not store a dead-letter record; it stays failed", extra={**about, "error": str(exc)})
        return None
    log.info("record too large for a message: stored for the dead-letter queue", extra=about)
    log.debug("stored record", extra={**about, **location})  # the key holds the sequence number: DEBUG only
    return Letter(index, pointer, stored=key)


def _out_of_time(unsent: list[Letter]) -> None:
    stored = [letter.stored for letter in unsent if letter.stored]
    log.error(
        "out of time to send to the dead-letter queue; the records stay failed",
        extra={"records": len(unsent), "storedObjects": len(stored)},
    )
    _debug_stored(stored)


def _debug_stored(stored: list[str]) -> None:
    if stored:  # left for the prefix's lifecycle rule; the keys hold sequence numbers: DEBUG only
        log.debug("stored records not sent", extra={"storedObjects": stored})


def send_batch(runtime: Runtime, queue: str, batch: list[Letter], deadline: Deadline) -> list[int]:
    """Send one batch, tried again while it fails transiently and time remains (a request that timed out may have
    been taken: a record then reaches the queue twice, which redrive handles as already done)."""
    sqs = runtime.clients.sqs
    entries: list[SendMessageBatchRequestEntryTypeDef] = [
        {"Id": str(letter.index), "MessageBody": letter.body} for letter in batch
    ]
    stored = {str(letter.index): letter.stored for letter in batch if letter.stored}
    try:
        response = call_with_retry(
            lambda: call(sqs.send_message_batch, "SendMessageBatch", deadline, QueueUrl=queue, Entries=entries),
            runtime.settings,
            deadline,
        )
    except CleanupError as exc:
        log.error(
            "dead-letter queue send failed; the records stay failed",
            extra={"error": str(exc), "storedObjects": len(stored)},
        )
        _debug_stored(list(stored.values()))
        return []
    for failure in response.get("Failed", []):
        log.error("dead-letter queue refused a record; it stays failed", extra={"error": failure.get("Message")})
        _debug_stored([key] if (key := stored.get(str(failure.get("Id")))) else [])
    sent = {entry["Id"] for entry in entries}  # an entry naming no Id sent (a cut answer) stays failed: sent again
    return [int(entry["Id"]) for entry in response.get("Successful", []) if entry.get("Id") in sent]
