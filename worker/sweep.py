"""``cleanup-worker sweep`` and the scheduled Lambda ``worker.sweep.handler``: one sweep of expired sessions.

Both run :func:`cleanup.expiry.sweeper.sweep` once over ``SESSION_TABLE``. The sweep's deletes reach the usual cleanup
through the table's stream; this entry point only turns the sweep's report into an exit code or a Lambda result.
The kill switch is read before each run: paused (or unknown, never read), the run deletes nothing
(``{"paused": true}``); turned to a dry run, the sweep plans as under CLEANUP_MODE=dry-run.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from typing import Any

from cleanup.deadline import Deadline
from cleanup.exceptions import MissingConfigError
from cleanup.expiry.sweeper import sweep
from cleanup.killswitch import Mode
from cleanup.runtime import WarmRuntime
from worker import floors, shared_options
from worker.exit_codes import ExitCode
from worker.progress import bar

PAUSED = {"paused": True, "reason": "cleanup is paused by the kill switch: nothing was deleted"}

warm = WarmRuntime()
"""The runtime kept between invocations (``warm.use(runtime)`` hands the handler another)."""


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Sweep once (the schedule's event carries nothing we need) and return the sweep's counts.

    Failed deletes are not raised: the next scheduled sweep retries them, and the metrics and logs report them. With
    a library below its floor it deletes nothing and logs one ERROR line.
    """
    if (problem := floors.core_problem()) is not None:
        logging.getLogger("cleanup").error("refusing to sweep: %s", problem)
        return {"refused": problem}
    runtime = warm.get()
    if runtime.refresh_mode() is Mode.PAUSED:
        return PAUSED
    report = sweep(runtime, deadline=Deadline.from_lambda_context(context))
    return report.summary()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--table-name", help="the session table [SESSION_TABLE]")
    parser.add_argument("--table", dest="old_table", help=argparse.SUPPRESS)  # the old spelling, for a release
    parser.add_argument(
        "--page-size", type=int, default=None, help="items per index Query page (default: DynamoDB's 1 MB pages)"
    )


def main(args: argparse.Namespace) -> int:
    """Sweep once; print the counts as one JSON line. Exit 1 if a query or delete failed, 2 if misconfigured."""
    table = args.table_name or args.old_table
    if args.old_table:
        print("cleanup-worker sweep: --table is deprecated: use --table-name", file=sys.stderr)
    runner = shared_options.runtime(args, **({"session_table": table} if table else {}))
    try:
        if runner.refresh_mode() is Mode.PAUSED:
            print(json.dumps(PAUSED))
            return ExitCode.FAILED
        with bar("sweep", unit="buckets") as shown:
            report = sweep(runner, page_size=args.page_size, progress=_advancing(shown))
    except MissingConfigError as exc:
        print(f"cleanup-worker sweep: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    finally:
        runner.close()
    print(json.dumps(report.summary()))
    return ExitCode.OK if report.ok else ExitCode.FAILED


def _advancing(shown: Any) -> Callable[[int, int], None]:
    """Moves the bar to ``done`` of ``total`` expiry buckets read (their deletes follow)."""

    def advance(done: int, total: int) -> None:
        shown.total = total
        shown.update(done - shown.n)

    return advance
