"""A batch cleaned and reported: ``outcomes = run_batch(records, runtime, deadline)``, the entry every mode calls.

It cleans the batch (``cleanup.core.pipeline.process_batch``), sends its permanent failures to the dead-letter queue
(``cleanup.queues.deadletter``) and what could only wait to the backlog queue (``cleanup.queues.backlog``), and logs
and counts every outcome.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from cleanup.core.pipeline import Incoming, paused, process_batch
from cleanup.deadline import Deadline
from cleanup.queues.backlog import defer
from cleanup.queues.deadletter import dead_letter
from cleanup.runtime import Runtime
from cleanup.telemetry import log_outcomes
from schemas.outcomes import Outcome

__all__ = ["run_batch"]


def run_batch(
    records: Sequence[Incoming],
    runtime: Runtime,
    deadline: Deadline | None = None,
    *,
    attempts: Mapping[str, int] | None = None,
    give_up: Callable[[Outcome], bool] | None = None,
    backlog: bool = True,
    held: str | None = None,
) -> list[Outcome]:
    """Process a batch, dead-letter its permanent failures, and log and count every outcome.

    Args:
        records: the batch, in stream order.
        runtime: the process's runtime.
        deadline: when the batch must be answered by.
        attempts: how many times each record has now been tried (in its dead-letter message; once when not given).
        give_up: for consumers that retry in place (``cleanup.streams.retry_in_place``): which failed records to
            dead-letter now, permanent or not. Without it (Lambda, whose own retries come later) every permanent
            failure, at once.
        backlog: whether transient failures go to BACKLOG_QUEUE_URL (when set); False for the backlog's own drain.
        held: why nothing may be cleaned now (the kill switch's pause): every session record then fails, untouched,
            and goes to the backlog with all its actions left; the others are skipped as always.
    """
    deadline = deadline or Deadline()
    outcomes = process_batch(records, runtime, deadline) if held is None else paused(records, runtime, held)
    due = None if give_up is None else {o.sequence_number for o in outcomes if o.failed and give_up(o)}
    # Reporting may use the margin the deadline keeps before the invocation's end, but for the time to answer.
    reporting = deadline.for_reporting()
    outcomes = dead_letter(outcomes, records, runtime, only=due, attempts=attempts, deadline=reporting)
    # The backlog hook: what could only wait (a quota, time) leaves the stream for the backlog queue, with its
    # actions left (cleanup.queues.backlog); records given up on above are dead-lettered, not deferred.
    if backlog:
        outcomes = defer(outcomes, records, runtime, deadline=reporting)
    log_outcomes(outcomes)
    runtime.metrics.record_outcomes(outcomes)
    runtime.metrics.flush()
    return outcomes
