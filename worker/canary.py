"""``cleanup-worker canary`` and the scheduled Lambda ``worker.canary.handler``: one end-to-end canary session.

Both run :func:`cleanup.operations.canary.run_canary` once: a canary session is created through the write path,
ended, and watched until the worker has freed what it held; its latency (``CanaryLatencySeconds``), or that it was not
cleaned within CANARY_TIMEOUT_SECONDS (``CanaryNotCleaned``), is published. Run the command from a container's
scheduler (a Kubernetes CronJob, an ECS scheduled task) beside ``cleanup-worker run`` or the KCL image.

Exit code: 0 when the worker freed the canary in time (or a dry run, where it frees nothing, left it unrun), 1 when it
did not (or the canary could not be made), 2 when SESSION_TABLE or SCRATCH_BUCKET is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cleanup.deadline import Deadline
from cleanup.exceptions import CleanupError, MissingConfigError
from cleanup.operations.canary import CanaryReport, run_canary
from cleanup.runtime import WarmRuntime
from worker import shared_options
from worker.exit_codes import ExitCode

warm = WarmRuntime()
"""The runtime kept between invocations (``warm.use(runtime)`` hands the handler another)."""
HANDLER_MARGIN_SECONDS = 10.0  # the handler answers this long before its invocation's end


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """One canary (the schedule's event carries nothing we need); its report. Not cleaned is no error of the
    function's: the metric and the alarm say it."""
    runtime = warm.get()
    remaining = Deadline.from_lambda_context(context).remaining()
    timeout = min(runtime.settings.canary_timeout_seconds, max(1.0, remaining - HANDLER_MARGIN_SECONDS))
    return run_canary(runtime, timeout=timeout).as_dict()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", dest="as_json", help="print one JSON object on stdout")


def main(args: argparse.Namespace) -> int:
    """Run one canary and say how it went."""
    runtime = shared_options.runtime(args)
    try:
        report = run_canary(runtime)
    except MissingConfigError as exc:
        print(f"cleanup-worker canary: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except CleanupError as exc:  # the canary session could not be made or ended
        print(f"cleanup-worker canary: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    finally:
        runtime.close()
    print(json.dumps(report.as_dict()) if args.as_json else _line(report))
    return ExitCode.OK if report.cleaned or report.skipped else ExitCode.FAILED


def _line(report: CanaryReport) -> str:
    if report.skipped:
        return f"canary not run: {report.skipped} (the worker frees nothing)"
    if report.cleaned:
        return f"canary {report.session_id} cleaned in {report.seconds:.1f} s"
    return f"canary {report.session_id} NOT cleaned after {report.seconds:.0f} s: left {', '.join(report.left)}"
