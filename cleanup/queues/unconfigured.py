"""A backlog message naming an action kind this worker no longer runs: the kinds it runs are freed, and each unknown
kind is reported as its own permanent failure.

A message waits in the backlog up to 14 days, and ACTIONS may change meanwhile (a kind taken out, or a plugin not
installed here). Refusing the whole message would keep what the configured kinds free (a grant, scratch data) for
want of one kind; freeing nothing of the unknown kind is all the worker can do for it. So once the kinds it runs have
cleaned the record, the record is reported failed, permanently, with one failed action per unknown kind
(``action 'x' is not in ACTIONS``), and dead-lettered with the actions' results: the dead letter says what is left,
and redrive, once the kind is configured again, finishes it. Without a dead-letter queue the message stays in the
backlog (the kinds that ran answer "already done" on its next receive) until the queue's maxReceiveCount moves it to
the backlog's dead-letter queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from cleanup.deadline import Deadline
from cleanup.queues.deadletter import dead_letter
from cleanup.telemetry import log, log_outcomes
from schemas.outcomes import ActionResult, ActionStatus, Outcome, Status
from schemas.records import StreamRecord, UnreadableRecord

if TYPE_CHECKING:
    from cleanup.runtime import Runtime


def not_configured(name: str, runtime: Runtime) -> ActionResult:
    """The failed result of kind ``name``, which this worker does not run."""
    running = ", ".join(kind.name for kind in runtime.kind_classes)
    return ActionResult(
        action=name,
        status=ActionStatus.FAILED,
        error=f"action {name!r} is not in ACTIONS ({running}): what it frees is left; redrive once it is configured",
        permanent=True,
    )


def report_unknown(
    cleaned: Sequence[tuple[Outcome, StreamRecord | UnreadableRecord, Sequence[str]]],
    runtime: Runtime,
    deadline: Deadline,
) -> list[bool]:
    """For each record the configured kinds have cleaned, and the kinds left that are not configured: whether its
    message is done (its record dead-lettered with those kinds failed; always, when none is left)."""
    pending = [(index, outcome, record, unknown) for index, (outcome, record, unknown) in enumerate(cleaned) if unknown]
    done = [True] * len(cleaned)
    if not pending:
        return done
    failed = [
        outcome.model_copy(
            update={
                "status": Status.FAILED,
                "actions": (*outcome.actions, *(not_configured(name, runtime) for name in unknown)),
                "error": "; ".join(f"{name}: not in ACTIONS" for name in unknown),
                "permanent": True,
            }
        )
        for _, outcome, _, unknown in pending
    ]
    sent = dead_letter(failed, [record for _, _, record, _ in pending], runtime, deadline=deadline)
    log_outcomes(sent)
    for (index, _, _, unknown), outcome in zip(pending, sent, strict=True):
        done[index] = outcome.dead_lettered
        log.error(
            "backlog message names actions this worker does not run; the others were cleaned",
            extra={
                "sequenceNumber": outcome.sequence_number,
                "actions": unknown,
                "deadLettered": outcome.dead_lettered,
            },
        )
        for name in unknown:  # the record itself was counted when the kinds that run cleaned it
            runtime.metrics.count("ActionFailures", "Action", name)
        if outcome.dead_lettered:
            runtime.metrics.count("RecordsDeadLettered")
    runtime.metrics.flush()
    return done
