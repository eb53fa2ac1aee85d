"""``cleanup-worker sweep`` and the scheduled Lambda ``worker.sweep.handler``: one sweep of expired sessions.

Both run :func:`cleanup.expiry.sweeper.sweep` once over ``SESSION_TABLE``. The sweep's deletes reach the usual cleanup
through the table's stream; this entry point only turns the sweep's report into an exit code or a Lambda result.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from cleanup.aws.retry import Deadline
from cleanup.exceptions import MissingConfigError
from cleanup.expiry.sweeper import sweep
from cleanup.runtime import Runtime, WarmRuntime
from worker import floors
from worker.exit_codes import ExitCode

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
    report = sweep(warm.get(), deadline=Deadline.from_lambda_context(context))
    return report.summary()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--table", help="the session table (default: SESSION_TABLE)")
    parser.add_argument(
        "--page-size", type=int, default=None, help="items per index Query page (default: DynamoDB's 1 MB pages)"
    )


def main(args: argparse.Namespace) -> int:
    """Sweep once; print the counts as one JSON line. Exit 1 if a query or delete failed, 2 if misconfigured."""
    runner = Runtime.from_env(**({"session_table": args.table} if args.table else {}))
    try:
        report = sweep(runner, page_size=args.page_size)
    except MissingConfigError as exc:
        print(f"cleanup-worker sweep: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    finally:
        runner.close()
    print(json.dumps(report.summary()))
    return ExitCode.OK if report.ok else ExitCode.FAILED
