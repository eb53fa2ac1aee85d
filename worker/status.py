"""``cleanup-worker status``: the worker's state on one screen (or in one JSON object), from read-only calls.

Mode and kill switch; for the stream poller, each shard's checkpoint and lag (or, past the stream's retention, the
records lost) and the lease's holder and term, for the table's latest stream and every earlier one the poller has
not finished (``--table-name``); the
depth and oldest-message age of the dead-letter queue (DEAD_LETTER_QUEUE_URL), of the backlog of quota-bound work
(BACKLOG_QUEUE_URL: how many grants still wait for the quota, and since when) and of the on-failure queue (given on
the command line: it is the mapping's, not a setting of the worker); the last sweep. The gathering is
``cleanup.operations.status``; this module picks the stream and prints.

Exit code: 0 when every part could be read and no record is lost or about to be (a waiting record past the stream's
critical age), 1 otherwise (shown with its error, loss or warning), 2 on usage errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import IO, Any

from cleanup.exceptions import CleanupError
from cleanup.operations import status
from cleanup.runtime import Runtime
from cleanup.streams.reader import latest_stream_arn
from cleanup.streams.record_age import verdict
from worker import shared_options
from worker.exit_codes import ExitCode


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--table-name", help="the poller's table (default: SESSION_TABLE): its latest stream")
    source.add_argument("--stream-arn", help="the poller's stream")
    parser.add_argument("--on-failure-queue-url", help="the event source mapping's on-failure queue")
    parser.add_argument("--json", action="store_true", dest="as_json", help="print one JSON object on stdout")


def main(args: argparse.Namespace) -> int:
    """Gather the status with the settings from the environment and print it."""
    runtime = shared_options.runtime(args)
    try:
        report = gather(args, runtime)
    finally:
        runtime.close()
    if report is None:
        return ExitCode.USAGE
    if args.as_json:
        print(json.dumps(report))
    else:
        show(report, sys.stdout)
    return ExitCode.FAILED if _errors(report) else ExitCode.OK


def gather(args: argparse.Namespace, runtime: Runtime) -> dict[str, Any] | None:
    """Every part of the status (None, with a line on stderr, when there is no stream to look at)."""
    table = args.table_name or runtime.settings.session_table
    try:
        stream_arn = args.stream_arn or latest_stream_arn(runtime.clients.dynamodb, table or "")
    except CleanupError as exc:
        print(f"cleanup-worker status: {exc}", file=sys.stderr)
        return None
    queues = {
        "deadLetter": runtime.settings.dead_letter_queue_url,
        "backlog": runtime.settings.backlog_queue_url,
        "onFailure": args.on_failure_queue_url,
    }
    report: dict[str, Any] = {
        "mode": status.mode(runtime),
        "poller": status.poller(runtime, stream_arn),
        "queues": {name: status.queue(runtime, url) for name, url in queues.items() if url},
        "lastSweep": status.last_sweep(runtime),
    }
    if not args.stream_arn:  # a table's: its earlier streams the poller has not finished come first
        report["earlierStreams"] = status.earlier_streams(runtime, stream_arn)
    return report


def _errors(report: dict[str, Any]) -> bool:
    """Whether a part could not be read (an unreadable kill switch is shown, but the mode in force is known), or a
    shard shows records lost or about to be."""
    earlier = report.get("earlierStreams", [])
    pollers = [report["poller"], *(earlier if isinstance(earlier, list) else [])]
    parts = [*pollers, *[s for p in pollers for s in p.get("shards", [])], *report["queues"].values()]
    parts += [report["lastSweep"], earlier if isinstance(earlier, dict) else {}]
    return any(part.get("error") or part.get("lost") or _critical(part) for part in parts)


def _critical(part: dict[str, Any]) -> bool:
    lag = part.get("lagSeconds")
    return isinstance(lag, int | float) and verdict(lag) == "critical"


LABELS = {"deadLetter": "dead-letter", "backlog": "backlog", "onFailure": "on-failure"}


def show(report: dict[str, Any], out: IO[str]) -> None:
    """The status as a few aligned lines per part."""
    mode = report["mode"]
    print(
        f"mode         {mode['mode']} (from {mode['source']}; CLEANUP_MODE {mode['environment']}, "
        f"kill switch {mode['killSwitch']})",
        file=out,
    )
    if mode.get("error"):
        print(f"             kill switch unreadable: {mode['error']}", file=out)
    earlier = report.get("earlierStreams", [])
    if isinstance(earlier, dict):
        print(f"earlier      cannot list the table's earlier streams: {earlier['error']}", file=out)
    for poller in earlier if isinstance(earlier, list) else []:
        _show_poller(poller, out, "earlier")
    _show_poller(report["poller"], out)
    for name, queue in report["queues"].items():
        label = LABELS.get(name, name)
        if "error" in queue:
            print(f"{label:<12} error: {queue['error']}", file=out)
            continue
        age = queue["oldestAgeSeconds"]
        age_text = f"{age:.0f} s" if isinstance(age, float) else age
        print(f"{label:<12} {queue['messages']} messages ({queue['inFlight']} in flight), oldest {age_text}", file=out)
    sweep = report["lastSweep"]
    text = sweep.get("error") or (
        f"{sweep['at']}, {sweep['swept']} swept" if "swept" in sweep else f"unknown ({sweep['why']})"
    )
    print(f"last sweep   {text}", file=out)


def _show_poller(poller: dict[str, Any], out: IO[str], label: str = "stream") -> None:
    gone = " (gone: its unfinished shards are lost)" if poller.get("gone") else ""
    first = " (read before the latest)" if label == "earlier" and not gone else ""
    print(f"{label:<12} {poller['stream']}{gone}{first}", file=out)
    if "error" in poller:
        print(f"             error: {poller['error']}", file=out)
        return
    if poller["table"] is None:
        print("checkpoints  none: no poller has run on this stream (no checkpoint table)", file=out)
    lease = poller["lease"]
    holder = f"{lease['holder']} (term {lease['term']})" if lease["holder"] else "nobody"
    print(f"lease        {holder}", file=out)
    for shard in poller["shards"]:
        pin = f" (pinned at {shard['pinnedAt']})" if "pinnedAt" in shard else ""
        pin = pin or (f" (pinned since {shard['pinnedSince']})" if "pinnedSince" in shard else "")
        print(f"shard        {shard['shardId']}  checkpoint {shard['checkpoint'] or '-'}{pin}  {_lag(shard)}", file=out)


def _lag(shard: dict[str, Any]) -> str:
    """What a shard's line says after its checkpoint: the loss first, then what waits."""
    if "error" in shard:
        return f"error: {shard['error']}"
    lost = shard.get("lost")
    said = f"LOST: records after {lost['after'] or 'its start'} ({lost['why']})" if lost else ""
    if shard.get("finished"):
        waiting = "finished"
    elif "lagSeconds" in shard:
        waiting = f"{shard['waiting']} records waiting, oldest {shard['lagSeconds']:.0f} s"
        waiting += f"; WARNING: {shard['warning']}" if "warning" in shard else ""
    elif "waiting" in shard:
        waiting = "caught up"
    else:
        waiting = ""
    return "; then ".join(part for part in (said, waiting) if part)
