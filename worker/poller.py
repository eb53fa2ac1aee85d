"""``cleanup-worker run``: consume a DynamoDB stream from a container, one active consumer per stream.

The engine is ``cleanup.streams.poller.StreamPoller``, run by ``cleanup.streams.follow.StreamFollower`` (which follows
the table's stream to the next when it is disabled and enabled again); this module turns the command line and the
environment into one, installs the signal handlers, and turns its summary into an exit code.
"""

from __future__ import annotations

import argparse

from cleanup.exceptions import CheckpointTableError, CleanupError
from cleanup.streams.follow import StreamFollower
from cleanup.streams.reader import latest_stream_arn
from cleanup.streams.shard_state import PollSummary
from cleanup.telemetry import log
from schemas.records import stream_table
from worker import shared_options
from worker.exit_codes import ExitCode
from worker.signals import shutdown_on_signals


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``run`` sub-command's options."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--table-name", help="read the latest stream of this table (and the next, if it changes)")
    source.add_argument("--stream-arn", help="read this stream")
    parser.add_argument(
        "--until-idle",
        action="store_true",
        help="stop once every shard is drained (for batch runs); exit 1 if a record is left failing or was lost",
    )
    parser.add_argument(
        "--consumer-id",
        help="this consumer's name in the lease (default: host and pid); a token of the process's own is added",
    )


def main(args: argparse.Namespace) -> int:
    """Run the poller until SIGTERM/SIGINT (or, with ``--until-idle``, until the stream is drained)."""
    runtime = shared_options.runtime(args)
    try:
        stream_arn = args.stream_arn or latest_stream_arn(runtime.clients.dynamodb, args.table_name)
    except CleanupError as exc:  # no such table or stream, or the table cannot be described
        log.error(str(exc))
        return ExitCode.USAGE
    # The stream named on the command line is the session table's, unless SESSION_TABLE says which table is.
    table = stream_table(stream_arn)
    follower = StreamFollower(
        runtime.with_session_table(table) if table else runtime,
        stream_arn,
        table=args.table_name,  # a stream named by its ARN is not followed to the next
        consumer_id=args.consumer_id,
    )
    try:
        with shutdown_on_signals(follower.request_stop, runtime.settings.shutdown_grace_seconds):
            summary = follower.run(until_idle=args.until_idle)
    except CheckpointTableError as exc:
        log.error(str(exc), extra={"table": runtime.settings.checkpoint_table})  # one line, with the fix
        return ExitCode.USAGE
    finally:
        runtime.close()
    log.info("poller stopped", extra={"summary": summary.as_dict()})
    return exit_code(summary)


def exit_code(summary: PollSummary) -> ExitCode:
    """1 when something is left undone: a record still failing, records the stream lost before they were read
    (trimmed: already reported by sequence number, and to be redriven or cleaned by hand), or records left in the
    stream because the kill switch paused cleanup."""
    return ExitCode.FAILED if summary.blocked or summary.lost or summary.paused else ExitCode.OK
