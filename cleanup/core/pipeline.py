"""The one core every entry point uses: ``outcomes = process_batch(records, runtime, deadline)``.

``cleanup.queues.reporting.run_batch`` is the entry: it cleans the batch (``process_batch``), then sends what must go
to the dead-letter queue and the backlog, and logs and counts every outcome. ``process_batch`` only cleans: decode
(the adapter) -> classify -> plan and act (``cleanup.core.plan.clean_session``) -> outcome, per record, records
concurrently on a bounded I/O pool. Each stage is handed the record and returns; none calls back into the pipeline.
Records of the same item key keep their stream order: they run one after another on one worker, and once one of them
fails the later ones are not executed and are reported failed too, so a retry replays them in order.

Every destructive call of a record goes through its ``Fence`` (``cleanup.core.fence``): a fresh read of the live item in
SESSION_TABLE, positively understood, or the resource is kept. Those reads and the scratch deletions of the records
being cleaned at the same moment go in shared requests (``cleanup.actions.batch_calls``: BatchGetItem, and DeleteObjects
of several sessions' keys), each record answered for its own part.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from cleanup.aws.coalesce import READ, Batchmates
from cleanup.core.classify import Decision, classify, classify_here, item_key
from cleanup.core.fence import Reader
from cleanup.core.plan import clean_session
from cleanup.core.process import Calls, Process
from cleanup.deadline import Deadline
from cleanup.exceptions import CleanupError, MissingConfigError, PermanentError
from cleanup.telemetry import log
from schemas.outcomes import ActionResult, Outcome, Status
from schemas.records import StreamRecord, UnreadableRecord
from schemas.settings import CleanupMode

Incoming = StreamRecord | UnreadableRecord


def paused(records: Sequence[Incoming], runtime: Process, why: str) -> list[Outcome]:
    """Outcomes of records that must not be cleaned now: a session's record fails (transient), with nothing done."""
    outcomes = []
    for record in records:
        if isinstance(record, UnreadableRecord):
            outcomes.append(process_record(record, runtime, Deadline()))
            continue
        try:
            decision = classify(record, runtime.settings, shape=runtime.shape)
        except CleanupError as exc:  # a record that cannot be read is dead-lettered, as when cleaning
            outcomes.append(_failure(record, str(exc), permanent=isinstance(exc, PermanentError)))
            continue
        if decision.session is None:
            outcomes.append(_outcome(record, decision, Status.SKIPPED))
        else:
            outcomes.append(_outcome(record, decision, Status.FAILED, error=why))
    return outcomes


def process_batch(records: Sequence[Incoming], runtime: Process, deadline: Deadline | None = None) -> list[Outcome]:
    """One outcome per record, in the records' order."""
    deadline = deadline or Deadline()
    groups: dict[str, list[int]] = {}
    for index, record in enumerate(records):
        key = item_key(record) if isinstance(record, StreamRecord) else f"unreadable#{index}"
        groups.setdefault(key, []).append(index)
    outcomes: list[Outcome | None] = [None] * len(records)
    queue = deque(groups.values())
    workers = min(len(queue), runtime.settings.max_concurrency)
    calls = runtime.batch_calls(Batchmates(workers))

    def work() -> None:
        # Each worker takes the next item's records until none are left: one thread per item at a time, in order.
        with calls.mates.worker():
            while True:
                try:
                    indexes = queue.popleft()
                except IndexError:
                    return
                _run_group(records, indexes, outcomes, runtime, deadline, calls)

    if workers <= 1:
        work()
    else:
        for future in [runtime.executor.submit(work) for _ in range(workers)]:
            future.result()
    return [outcome for outcome in outcomes if outcome is not None]


def _run_group(
    records: Sequence[Incoming],
    indexes: list[int],
    outcomes: list[Outcome | None],
    runtime: Process,
    deadline: Deadline,
    calls: Calls,
) -> None:
    """The records of one item, in stream order; once one fails, the later ones are reported, not executed."""
    blocker: Outcome | None = None
    for index in indexes:
        record = records[index]
        if blocker is not None:
            outcomes[index] = _blocked(record, blocker)
            continue
        outcome = process_record(record, runtime, deadline, calls)
        calls.mates.head(READ)  # the next record starts with its read
        outcomes[index] = outcome
        if outcome.failed:
            blocker = outcome


def process_record(record: Incoming, runtime: Process, deadline: Deadline, calls: Calls | None = None) -> Outcome:
    """Clean one record's session. Any error becomes a failed outcome: this is the per-record boundary."""
    if isinstance(record, UnreadableRecord):
        return Outcome(sequence_number=record.sequence_number, status=Status.FAILED, error=record.error, permanent=True)
    try:
        return _clean(record, runtime, deadline, calls or runtime.batch_calls())
    except CleanupError as exc:
        return _failure(record, str(exc), permanent=isinstance(exc, PermanentError))
    except Exception as exc:  # a bug must not lose the record: report it, and dead-letter it
        log.exception("unexpected error", extra={"sequenceNumber": record.sequence_number})
        return _failure(record, f"internal error: {type(exc).__name__}: {exc}", permanent=True)


def _clean(record: StreamRecord, runtime: Process, deadline: Deadline, calls: Calls) -> Outcome:
    decision = classify_here(record, runtime)
    if decision.session is None:
        if decision.elsewhere is not None:  # a worker per region of a global table: that region cleans it
            runtime.metrics.count("SessionsElsewhere", "Region", decision.elsewhere)
        return _outcome(record, decision, Status.SKIPPED)
    dry_run = runtime.settings.cleanup_mode is CleanupMode.DRY_RUN
    results, stopped = clean_session(
        decision.session, _reader(record, runtime, calls), runtime, deadline, calls, dry_run
    )
    failures = [result for result in results if not result.ok]
    if stopped is not None:
        return _outcome(record, decision, Status.FAILED, results, error=stopped)
    if not failures:
        return _outcome(record, decision, Status.PLANNED if dry_run else Status.CLEANED, results)
    return _outcome(
        record,
        decision,
        Status.FAILED,
        results,
        error="; ".join(f"{result.action}: {result.error}" for result in failures),
        permanent=any(result.permanent for result in failures),
    )


def _reader(record: StreamRecord, runtime: Process, calls: Calls) -> Reader | None:
    """The fence's reader of the live item under ``record``'s key, in SESSION_TABLE (None: RACE_CHECK=false)."""
    if not runtime.settings.race_check:
        return None
    # SESSION_TABLE, always: a record's own table is what it claims, not what is checked. A Lambda mapping names its
    # table in eventSourceARN, which classify takes as SESSION_TABLE when the setting is absent.
    table = runtime.settings.session_table or record.table
    if not table:
        raise MissingConfigError(
            "cannot check for a reconnected session: set SESSION_TABLE (or RACE_CHECK=false, if keys are never reused)"
        )
    return calls.reader(table, record.keys)


def _outcome(
    record: StreamRecord,
    decision: Decision,
    status: Status,
    actions: tuple[ActionResult, ...] = (),
    *,
    error: str | None = None,
    permanent: bool = False,
) -> Outcome:
    session = decision.session
    return Outcome(
        sequence_number=record.sequence_number,
        status=status,
        event_id=record.event_id,
        event_name=record.event_name,
        key=decision.key,
        reason=decision.reason,
        skip_reason=decision.skip_reason,
        tenant_id=session.tenant_id if session else None,
        ttl_lag_seconds=decision.ttl_lag_seconds,
        actions=actions,
        error=error,
        permanent=permanent,
    )


def _failure(record: StreamRecord, error: str, *, permanent: bool) -> Outcome:
    return Outcome(
        sequence_number=record.sequence_number,
        status=Status.FAILED,
        event_id=record.event_id,
        event_name=record.event_name,
        key=item_key(record),
        error=error,
        permanent=permanent,
    )


def _blocked(record: Incoming, blocker: Outcome) -> Outcome:
    error = f"not attempted: an earlier record of the same item ({blocker.sequence_number}) failed"
    if isinstance(record, UnreadableRecord):
        return Outcome(sequence_number=record.sequence_number, status=Status.FAILED, error=error)
    return _failure(record, error, permanent=False)
