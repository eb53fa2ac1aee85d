"""``cleanup-worker reconcile`` and the scheduled Lambda ``worker.reconcile.handler``: free what the stream missed.

Both run :func:`cleanup.operations.reconcile.reconcile` once: the grants on the worker's keys, the session-level
scratch prefixes and the registry's room memberships whose session is gone are freed, behind the fence, past the
grace period. The kill switch is read first: paused (or unknown, never read), nothing is listed or freed
(``{"paused": true}``, exit 1); turned to a dry run, the plan is reported.

Exit code: 0 when everything listed was decided, 1 when something could not be read or freed (or paused), 2 when a
setting it needs is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import IO, Any

from cleanup.deadline import Deadline
from cleanup.exceptions import CleanupError, MissingConfigError
from cleanup.killswitch import Mode
from cleanup.operations.reconcile import KEPT, ReconcileReport, Verdict, reconcile
from cleanup.runtime import WarmRuntime
from worker import shared_options
from worker.exit_codes import ExitCode
from worker.progress import bar

PAUSED = {"paused": True, "reason": "cleanup is paused by the kill switch: nothing was reconciled"}

warm = WarmRuntime()
"""The runtime kept between invocations (``warm.use(runtime)`` hands the handler another)."""


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Reconcile once (the schedule's event carries nothing we need) and return the counts.

    Resources that could not be freed are not raised: the next run retries them, and the metrics and logs report
    them.
    """
    runtime = warm.get()
    if runtime.refresh_mode() is Mode.PAUSED:
        return PAUSED
    return reconcile(runtime, deadline=Deadline.from_lambda_context(context)).summary()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", dest="as_json", help="print one JSON object on stdout")


def main(args: argparse.Namespace) -> int:
    """Reconcile once and print the counts (and, in a dry run, the plan)."""
    runtime = shared_options.runtime(args)
    try:
        if runtime.refresh_mode() is Mode.PAUSED:
            print(json.dumps(PAUSED) if args.as_json else PAUSED["reason"])
            return ExitCode.FAILED
        with bar("reconcile", unit="resources", quiet=args.as_json) as shown:
            report = reconcile(runtime, progress=shown.update)
    except MissingConfigError as exc:
        print(f"cleanup-worker reconcile: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except CleanupError as exc:  # a listing failed: nothing after it was decided
        print(f"cleanup-worker reconcile: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    finally:
        runtime.close()
    if args.as_json:
        print(json.dumps(report.summary()))
    else:
        show(report, sys.stdout)
    return ExitCode.OK if report.ok else ExitCode.FAILED


def show(report: ReconcileReport, out: IO[str]) -> None:
    """The report as readable lines: one per resource, then a dry run's plan."""
    print(f"reconcile ({report.mode})", file=out)
    for resource, counts in report.counts.items():
        kept = ", ".join(f"{verdict.value} {counts[verdict]}" for verdict in KEPT)
        done = Verdict.PLANNED if report.mode == "dry-run" else Verdict.FREED
        print(
            f"  {resource}: listed {sum(counts.values())}, {done.value} {counts[done]}, kept {kept}, "
            f"gone {counts[Verdict.GONE]}, failed {counts[Verdict.FAILED]}",
            file=out,
        )
    if report.stopped:
        print(f"  stopped: {report.stopped}", file=out)
    for entry in report.plan:
        where = entry.get("keyId") or entry.get("bucket") or entry.get("membership")
        print(f"  would free {entry['resource']} {entry['id']} ({where}) of session {entry['sessionId']}", file=out)
