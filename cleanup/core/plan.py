"""Planning a session's cleanup into steps, and carrying them out (or, in a dry run, describing them).

``clean_session`` is what the pipeline calls once a record is a session to clean: it puts the session behind its
fence, plans the steps and acts on them; the steps' actions do not call back into the pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from cleanup.aws.retry import call_with_retry
from cleanup.core.action_api import Context, Holding, Run, Step
from cleanup.core.fence import Fence, Reader, Reading
from cleanup.core.process import Calls, Process
from cleanup.deadline import Deadline
from cleanup.exceptions import CleanupError, NowHeldError, PermanentError, TransientError
from cleanup.telemetry import log
from schemas.outcomes import ActionResult, ActionStatus
from schemas.session import Session

__all__ = ["Run", "Step", "act", "clean_session", "execute", "plan"]

SUCCESS = (ActionStatus.DONE, ActionStatus.ALREADY_DONE)


def plan(session: Session, runtime: Process, fence: Fence, calls: Calls | None = None) -> list[Step]:
    """The steps that free ``session``'s resources, each enabled action kind's in ACTIONS's order (by default: close
    its socket, retire its grant, delete its scratch data, and, with a registry, remove its connection's room
    memberships).

    Every freeing call of every step goes through ``fence`` (``cleanup.core.fence``). With ``calls``, scratch pages
    are deleted together with those of the batch's other records. A kind that is not built in plans with read-only
    clients (``Process.plugin_host``): it frees through its gates.
    """
    steps: list[Step] = []
    for kind in runtime.kinds:
        host = runtime if runtime.built_in(kind) else runtime.plugin_host
        steps.extend(kind.plan(session, Context(host, fence, calls, runtime.sender)))
    return steps


def clean_session(
    session: Session, read: Reader | None, runtime: Process, deadline: Deadline, calls: Calls, dry_run: bool
) -> tuple[tuple[ActionResult, ...], str | None]:
    """Free ``session``'s resources behind a fence reading the live item with ``read`` (None: RACE_CHECK=false).

    Returns:
        Each step's result, in plan order; and why the fence stopped the record, if it did.
    """
    fence = Fence(read, runtime.settings.fence_read_max_age_seconds)
    steps = plan(session, runtime, fence, calls)
    done = act(steps, runtime, deadline, fence, dry_run=dry_run)
    return tuple(done[id(step)] for step in steps), fence.stopped


def execute(step: Step, runtime: Process, deadline: Deadline, fence: Fence, *, dry_run: bool = False) -> ActionResult:
    """Carry out ``step`` with retries; never raises, it returns a failed result.

    Its freeing calls go through ``fence``, which keeps what the live item under the same key holds (the step is then
    "kept"). The step is judged by what its gates saw as well as by what it returns: a refusal it swallowed is its
    result, and "done" with no permit given is its failure. Any exception it raises is its own failure (transient,
    unless a ``PermanentError``), and the record's other steps still run. A dry run asks the fence what it would keep,
    and frees nothing.
    """
    run = step.preview if dry_run else step.run
    retried = _retried(runtime, step, fence)
    try:
        # A step that will not run (refused, or only planned) is still "kept" when the live session holds it.
        if step.refusal is not None or dry_run or run is None:
            held = call_with_retry(lambda: _verdict(step, fence, deadline), runtime.settings, deadline, retried)
            if held is Holding.HELD:
                return ActionResult(action=step.action, status=ActionStatus.KEPT, detail=_HELD)
        if step.refusal is not None:
            return _failed(step, step.refusal, refused=True)
        if run is None:
            return ActionResult(action=step.action, status=ActionStatus.PLANNED, detail=step.detail)
        tried = _judged if not dry_run else _bounded
        status, counts = call_with_retry(
            lambda: tried(step, run, runtime, deadline, fence), runtime.settings, deadline, on_retry=retried
        )
    except NowHeldError:
        return ActionResult(action=step.action, status=ActionStatus.KEPT, detail={**step.detail, **_HELD})
    except CleanupError as exc:
        fence.stale()
        return _failed(step, exc)
    except Exception as exc:  # a kind's own error (a plugin's client, an HTTP library): that kind's failure alone
        log.exception("action raised", extra={"action": step.action})
        fence.stale()
        return _failed(step, TransientError(f"{type(exc).__name__}: {exc}"))
    return ActionResult(action=step.action, status=status, detail={**step.detail, **counts})


def _judged(
    step: Step, run: Run, runtime: Process, deadline: Deadline, fence: Fence
) -> tuple[ActionStatus, dict[str, Any]]:
    """One try of ``step``, judged by what its gates saw.

    Raises:
        The refusal a gate of the step made, when the step reports success anyway (a kind that swallowed it).
        PermanentError: the step reports "done" and none of its gates gave a permit.
    """
    gates = fence.gates(step.action, step.resource)
    for gate in gates:
        gate.reset()
    status, counts = _bounded(step, run, runtime, deadline, fence)
    refusal = next((gate.refusal for gate in gates if gate.refusal is not None), None)
    if refusal is not None and status in SUCCESS:
        raise refusal
    if status is ActionStatus.DONE and not any(gate.granted for gate in gates):
        raise PermanentError(f"{step.action}: reported done, but none of its freeing calls was given a permit")
    return status, counts


def _bounded(
    step: Step, run: Run, runtime: Process, deadline: Deadline, fence: Fence
) -> tuple[ActionStatus, dict[str, Any]]:
    """``run(deadline)``; a kind that is not built in runs on its own pool, and one still running at its bound is
    reported (transient) instead of waited for, its gates closed so that it frees nothing more."""
    if runtime.built_in(step.kind):
        return run(deadline)
    return waited(runtime.plugin_executor.submit(run, deadline), step, runtime, deadline, fence)


T = TypeVar("T")


def waited(future: Future[T], step: Step, runtime: Process, deadline: Deadline, fence: Fence) -> T:
    """``future``'s result, waited for until ``step_bound``.

    Raises:
        TransientError: the step is still running: not waited for, its gates closed so that it frees nothing more.
    """
    try:
        return future.result(timeout=step_bound(runtime, deadline))
    except FutureTimeout:
        why = f"{step.action}: still running at the record's bound, not waited for; its gates are closed"
        for gate in fence.gates(step.action, step.resource):
            gate.close(why)
        raise TransientError(why) from None


def step_bound(runtime: Process, deadline: Deadline) -> float:
    """How long the host waits for a step: until the record's deadline, or, where there is none, CALL_WAIT_SECONDS
    for each of its tries."""
    if deadline.at is not None:
        return max(0.0, deadline.remaining())
    return runtime.settings.call_wait_seconds * runtime.settings.retry_attempts


def act(
    steps: list[Step], runtime: Process, deadline: Deadline, fence: Fence, *, dry_run: bool
) -> dict[int, ActionResult]:
    """Each step's result, by ``id(step)``.

    Steps go by their kind's ``phase``. The scratch data goes first (a user back while the grant is retired,
    seconds under a KMS quota, finds a re-created session's data whole), each page on a read of its own. Then the
    ``together`` kinds, the socket and the grant, are freed together on one read, the grant beside the socket
    (``Process.side_executor``), as the fence allows for calls issued together; then the memberships and the rest.
    Whatever follows a destructive call, or retries a step, reads again. A step beside another still running at the
    record's bound is reported (transient), not waited for. A dry run plans the steps one after another.
    """
    ordered = sorted(steps, key=lambda step: step.kind.phase)
    for step in [] if dry_run else steps:
        if step.prepare is not None:
            step.prepare(deadline)  # a grant's name, read beside the first calls (``cleanup.actions.grant``)
    started: set[int] = set()
    beside: dict[int, Future[ActionResult]] = {}

    def launch(reading: Reading) -> None:
        for step in ordered:
            if step.kind.together and step.run is not None and id(step) not in started | beside.keys():
                fence.allow_once(step.action, reading)
                beside[id(step)] = runtime.side_executor.submit(execute, step, runtime, deadline, fence)

    done: dict[int, ActionResult] = {}
    for step in ordered:
        if id(step) in beside:
            continue
        if step.kind.together and not dry_run:
            fence.on_next_permit(launch)  # this step's first call takes the other ``together`` kinds' along
        started.add(id(step))
        done[id(step)] = execute(step, runtime, deadline, fence, dry_run=dry_run)
        fence.on_next_permit(None)
    for key, future in beside.items():
        done[key] = _waited(future, next(step for step in steps if id(step) == key), runtime, deadline, fence)
    return done


def _waited(
    future: Future[ActionResult], step: Step, runtime: Process, deadline: Deadline, fence: Fence
) -> ActionResult:
    try:
        return waited(future, step, runtime, deadline, fence)
    except TransientError as exc:
        return _failed(step, exc)


_HELD = {"heldBy": "live session"}


def _verdict(step: Step, fence: Fence, deadline: Deadline) -> Holding:
    held = fence.verdict(step.kind, step.resource, step.location, deadline)
    live = fence.live()
    if held is Holding.UNKNOWN and live is not None:
        raise step.kind.unknown(step.resource, live)
    return held


def _retried(runtime: Process, step: Step, fence: Fence) -> Callable[[BaseException], None]:
    def on_retry(exc: BaseException) -> None:
        fence.stale()  # a retried step reads the live item again before its next destructive call
        runtime.metrics.count("Retries", "Action", step.action)

    return on_retry


def _failed(step: Step, exc: CleanupError, refused: bool = False) -> ActionResult:
    detail = {**step.detail, "refused": True} if refused else step.detail
    return ActionResult(
        action=step.action,
        status=ActionStatus.FAILED,
        detail=detail,
        error=str(exc),
        permanent=isinstance(exc, PermanentError),
    )
