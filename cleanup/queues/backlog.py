"""The backlog: records whose cleanup could only wait, kept in a durable queue instead of the stream.

A record whose cleanup did not finish only for want of a quota's turn or of time (a transient failure; with
QUOTA_WAIT_SECONDS set, a RetireGrant with no turn within it) goes to BACKLOG_QUEUE_URL, with the actions it has
left, and counts as handled (``Status.DEFERRED``): the stream moves on, and the next records' sockets and scratch data
are freed at their own pace, not at the grant quota's. What was done stays done. The queue keeps a message 14 days,
where a stream keeps a record 24 hours, and ``worker.backlog`` drains it through the same core, at the learnt rate:
the live item is read again before every destructive call, however late.

A message is the dead-letter message (``cleanup.queues.deadletter``: the record cut to what cleaning needs, or, when too
large, the claim-check object naming it) with ``remaining``, the actions left, ``pace``, the rates its worker learnt
for its services' quotas (where a cold drain starts its pacing: :func:`pace_hint`), and its integrity tag over all of
it (``cleanup.queues.integrity``). Only when SQS has accepted it is the record handled; else it stays failed and is
reported, and the stream delivers it again.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cleanup.actions.loading import DEFAULT, REPLACED_BY, load_kinds
from cleanup.aws.pacing import own_quota
from cleanup.aws.retry import call_with_retry
from cleanup.core.action_api import ActionKind
from cleanup.deadline import Deadline
from cleanup.exceptions import CleanupError, MessageFormatError
from cleanup.queues.deadletter import MESSAGE_FORMAT, batches, letters_for, message_body, send_batch
from cleanup.telemetry import log
from schemas.outcomes import ActionStatus, Outcome, Status
from schemas.records import StreamRecord, UnreadableRecord
from schemas.settings import AttributeNames, CleanupMode

if TYPE_CHECKING:
    from cleanup.runtime import Runtime

ACTIONS = tuple(DEFAULT.split(","))
"""The default actions (a runtime's are ``Runtime.kind_classes``: ACTIONS)."""
UNTAGGED = (
    "BACKLOG_QUEUE_URL is set without INTEGRITY_KEY_ID: the drain would refuse every message sent there, so none is; "
    "the records stay failed and the stream delivers them again (set INTEGRITY_KEY_ID to the template's HMAC key)"
)
MAX_PACED = 8  # services a message's pace names, at most
ACTION_NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")  # as ACTIONS spells a kind's name
SERVICE_NAME = re.compile(r"[a-z0-9]{1,40}(-[a-z0-9]{1,40}){0,2}")  # botocore's hyphenated service ids


def defer(
    outcomes: list[Outcome],
    records: Sequence[StreamRecord | UnreadableRecord],
    runtime: Runtime,
    *,
    deadline: Deadline,
) -> list[Outcome]:
    """Send each transient failure to BACKLOG_QUEUE_URL (when set); returns the outcomes, those sent ``DEFERRED``."""
    queue = runtime.settings.backlog_for_writing
    pending = [i for i, outcome in enumerate(outcomes) if _deferrable(outcome, records[i])]
    if not pending or runtime.settings.cleanup_mode is CleanupMode.DRY_RUN:
        return outcomes
    if not queue:
        if runtime.settings.backlog_queue_url:
            log.error(UNTAGGED, extra={"records": len(pending)})
        return outcomes
    try:
        limit = call_with_retry(lambda: runtime.message_limit(queue, deadline), runtime.settings, deadline)
    except CleanupError as exc:
        log.error("backlog queue's message size unknown; the records stay failed", extra={"error": str(exc)})
        return outcomes
    names, actions = runtime.settings.attributes, _names(runtime.kind_classes)
    pace = runtime.clients.pacer.learnt()
    bodies = [
        (
            index,
            backlog_body(
                outcomes[index], records[index], names=names, actions=actions, pace=pace, own=runtime.shape.extra
            ),
        )
        for index in pending
    ]
    letters = letters_for(bodies, runtime, limit, deadline)
    result = list(outcomes)
    for batch in batches(letters):
        if deadline.remaining() <= 0:
            break  # the rest stay failed: the stream delivers them again
        for index in send_batch(runtime, queue, batch, deadline):
            result[index] = outcomes[index].model_copy(update={"status": Status.DEFERRED})
    return result


def _deferrable(outcome: Outcome, record: StreamRecord | UnreadableRecord) -> bool:
    return outcome.failed and not outcome.permanent and isinstance(record, StreamRecord)


def _names(kinds: Sequence[type[ActionKind]]) -> tuple[str, ...]:
    return tuple(kind.name for kind in kinds)


def backlog_body(
    outcome: Outcome,
    record: StreamRecord | UnreadableRecord,
    *,
    names: AttributeNames | None = None,
    actions: Sequence[str] = ACTIONS,
    pace: Mapping[str, float] | None = None,
    own: tuple[str, ...] = (),
) -> str:
    """The (untagged) dead-letter message of the record, with ``remaining``: the actions not done (all ``actions``,
    when none ran), and ``pace``: the rates this process learnt for its services' quotas (``Pacer.learnt``), for the
    drain to start at (:func:`pace_hint`).

    A step "kept" in a failed record is left too: the fence may have stopped it (the session came back while it was
    cleaned), and its next run reads the live item again, keeping it if it is still held.
    """
    message = json.loads(message_body(outcome, record, names=names, own=own))
    done = (ActionStatus.DONE, ActionStatus.ALREADY_DONE)
    left = [action.action for action in outcome.actions if action.status not in done]
    message["remaining"] = left or list(actions)
    if pace:
        message["pace"] = dict(pace)
    return json.dumps(message, default=str)


def load_message(body: str) -> dict[str, Any]:
    """A backlog message as a JSON object (its integrity is checked next, then :func:`split_remaining`).

    Raises:
        MessageFormatError: not JSON, or not a backlog message.
    """
    try:
        message = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise MessageFormatError(f"the backlog message is not JSON: {exc}") from exc
    if not isinstance(message, dict) or message.get("format") != MESSAGE_FORMAT:
        raise MessageFormatError("not a backlog message")
    return message


def split_remaining(message: dict[str, Any], known: Sequence[str] = ACTIONS) -> tuple[list[str], list[str]]:
    """The actions a backlog message has left that this worker runs (``known``: its ACTIONS), and those it does not.

    A name this worker does not run whose documented replacement it runs (``connection``, in whose place ACTIONS may
    name ``http-close``) counts as the replacement: what the message names is freed by the kind configured for it now.
    A name neither known nor replaced is returned apart: the kind was taken out of ACTIONS since the message was
    written, and only that kind's part is left undone (reported as its own failure); the rest is cleaned.

    Raises:
        MessageFormatError: no list of actions, an empty one, or an entry that is not an action's name.
    """
    remaining = message.get("remaining")
    if not isinstance(remaining, list) or not remaining or not all(_action_name(name) for name in remaining):
        raise MessageFormatError(f"the backlog message names no actions left: {str(remaining)[:200]!r}")
    runs, unknown = [], []
    for name in dict.fromkeys(str(name) for name in remaining):
        replacement = REPLACED_BY.get(name)
        if name in known:
            runs.append(name)
        elif replacement in known:
            runs.append(str(replacement))
        else:
            unknown.append(name)
    return list(dict.fromkeys(runs)), unknown


def _action_name(name: object) -> bool:
    return isinstance(name, str) and ACTION_NAME.fullmatch(name) is not None


def pace_hint(message: dict[str, Any]) -> dict[str, float]:
    """The rates a backlog message says its sender learnt (``pace``: requests a second per service), as far as they
    are understood: at most MAX_PACED services, each a lower-case service name and a positive finite number. Only a
    hint where a drain starts its pacing (``Pacer.seed``), never a reason to free or keep anything: one not
    understood is dropped (the drain then starts unpaced, and learns the rate from the service's answers)."""
    pace = message.get("pace")
    if not isinstance(pace, dict) or len(pace) > MAX_PACED:
        return {}
    understood = {}
    for name, value in pace.items():
        if isinstance(name, str) and SERVICE_NAME.fullmatch(name) and own_quota(name):
            rate = _positive(value)
            if rate is not None:
                understood[name] = rate
    return understood


def _positive(value: Any) -> float | None:
    """``value`` as a positive finite number, if it is one (a JSON integer may be too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        rate = float(value)
    except OverflowError:
        return None
    return rate if math.isfinite(rate) and rate > 0 else None


def only_remaining(
    raw: dict[str, Any], remaining: list[str], names: AttributeNames, kinds: Sequence[type[ActionKind]] | None = None
) -> dict[str, Any]:
    """The record with its old image cut to what the actions left need, so that the done ones are not done again.

    A done kind's owned attributes are dropped, unless a kind left reads one of them (the registry's step needs the
    connection's id: the connection's are kept while it is left). Only a DynamoDB record's ``OldImage`` is cut, and
    only while it keeps a session attribute (a kind left that owns none, as one freeing other rows of the partition,
    still needs the record to be a session's); any other record is returned as it is (every action is idempotent: a
    done one answers "already done").
    """
    image = raw.get("dynamodb", {}).get("OldImage") if isinstance(raw.get("dynamodb"), dict) else None
    if not isinstance(image, dict):
        return raw
    kinds = kinds if kinds is not None else load_kinds(",".join(ACTIONS))
    left = [kind for kind in kinds if kind.name in remaining]
    needed = {field for kind in left for field in (*kind.owns, *kind.reads)}
    drop = [
        attribute
        for kind in kinds
        if kind.name not in remaining and not needed & set(kind.owns)
        for attribute in (*(getattr(names, field) for field in kind.owns), *kind.attributes)
    ]
    keys = raw["dynamodb"].get("Keys")
    kept = set(keys) if isinstance(keys, dict) else set()  # a key attribute (ATTR_CONNECTION_ID=pk) stays: the
    cut = copy.deepcopy(raw)  # record's Keys must still be its image's, and its action is done again, idempotently
    for name in drop:
        if name not in kept:
            cut["dynamodb"]["OldImage"].pop(name, None)
    resources = {getattr(names, field) for kind in kinds for field in kind.naming()} | {
        attribute for kind in kinds for attribute in kind.attributes
    }
    if not any(name in cut["dynamodb"]["OldImage"] for name in resources):
        return raw  # cut to no session attribute, the record would no longer be a session's: done ones answer "done"
    return cut
