"""``cleanup-worker capture``: write a DynamoDB stream's records to a file, one JSON object per line, losslessly.

Each line is a record exactly as GetRecords sent it (base64 binary, epoch-seconds times), with the stream's
``eventSourceARN`` added as Lambda and the poller add it, so that ``replay`` knows the table the records are from.
Parent shards are read before their children, so an item's records stay in stream order in the file. Without
``--follow`` the capture ends once every shard is drained; with it, it keeps polling (and discovering new shards)
until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from cleanup.exceptions import CleanupError, StreamNotFoundError
from cleanup.streams.reader import Shard, ShardReader, latest_stream_arn, list_shards
from cleanup.telemetry import log
from worker import shared_options
from worker.exit_codes import ExitCode
from worker.progress import bar

if TYPE_CHECKING:
    from mypy_boto3_dynamodbstreams import DynamoDBStreamsClient


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--table-name", help="the table whose latest stream to read")
    source.add_argument("--stream-arn", help="the stream to read")
    parser.add_argument("--from", dest="start", choices=("trim-horizon", "latest"), default="trim-horizon")
    parser.add_argument("--follow", action="store_true", help="keep reading new records until interrupted")
    parser.add_argument("--out", required=True, type=Path, metavar="FILE.jsonl", help="where to write the records")


def main(args: argparse.Namespace) -> int:
    """Capture the stream named on the command line into ``args.out``."""
    if not args.out.parent.is_dir():
        folder = str(args.out.parent)
        print(f"cleanup-worker capture: no folder {folder!r} to write {args.out.name} in", file=sys.stderr)
        return ExitCode.USAGE
    settings = shared_options.settings(args)
    clients = shared_options.clients(args, settings)
    streams = clients.streams
    try:
        stream_arn = args.stream_arn or latest_stream_arn(clients.dynamodb, args.table_name)
        stop = threading.Event()
        if args.follow:
            _stop_on_signals(stop)
        # A stream's record count is not known before it is read: the bar shows what is done and the rate.
        with args.out.open("w", encoding="utf-8") as out, bar("capture") as progress:
            capture = Capture(streams, stream_arn, args.start.upper().replace("-", "_"), _writer(out, progress.update))
            capture.run(follow=args.follow, stop=stop, poll_seconds=settings.poll_interval_seconds)
    except StreamNotFoundError as exc:
        print(f"cleanup-worker capture: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except CleanupError as exc:
        print(f"cleanup-worker capture: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    shards = len(capture.readers)
    print(f"captured {capture.count} records from {shards} shard{'s' * (shards != 1)} of {stream_arn} into {args.out}")
    return ExitCode.OK


def _writer(out: IO[str], done: Callable[[int], object]) -> Callable[[list[dict[str, Any]]], None]:
    def write(records: list[dict[str, Any]]) -> None:
        out.writelines(json.dumps(record, separators=(",", ":")) + "\n" for record in records)
        done(len(records))
        out.flush()  # a followed capture that is killed keeps every page it read

    return write


def _stop_on_signals(stop: threading.Event) -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())


class Capture:
    """Reads every shard of one stream, parents before children, handing each page's raw records to ``sink``."""

    def __init__(
        self, streams: DynamoDBStreamsClient, stream_arn: str, start: str, sink: Callable[[list[dict[str, Any]]], None]
    ) -> None:
        self.streams, self.stream_arn, self.start, self.sink = streams, stream_arn, start, sink
        self.shards: dict[str, Shard] = {}
        self.readers: dict[str, ShardReader] = {}
        self.count = 0

    def run(
        self, *, follow: bool, stop: threading.Event, poll_seconds: float = 1.0, discover_seconds: float = 10.0
    ) -> None:
        """Read until every shard is drained (or, following, until ``stop`` is set)."""
        discovered_at = 0.0
        while not stop.is_set():
            if time.monotonic() - discovered_at >= discover_seconds or not self.shards:
                self.discover()
                discovered_at = time.monotonic()
            read = sum(self._read(reader) for reader in self._ready(follow))
            if not follow and all(reader.drained for reader in self.readers.values()):
                return
            if not read:
                stop.wait(poll_seconds)

    def discover(self) -> None:
        """Add the stream's shards not seen yet; a child is read whole, whatever ``--from`` said."""
        listed = list_shards(self.streams, self.stream_arn)
        ids = {shard.shard_id for shard in listed}
        for shard in listed:
            if shard.shard_id not in self.shards:
                self.shards[shard.shard_id] = shard
                start = "TRIM_HORIZON" if shard.parent_id in ids else self.start
                self.readers[shard.shard_id] = ShardReader(self.streams, self.stream_arn, shard.shard_id, start=start)

    def _ready(self, follow: bool) -> list[ShardReader]:
        # A child waits until its parent (if still in the stream) is read to its end.
        return [
            reader
            for shard_id, reader in self.readers.items()
            if not reader.ended
            and (follow or not reader.drained)
            and self._parent_ended(self.shards[shard_id].parent_id)
        ]

    def _parent_ended(self, parent: str | None) -> bool:
        return parent not in self.readers or self.readers[parent].ended

    def _read(self, reader: ShardReader) -> int:
        # GetRecords records do not name their stream: without it a replay would take them for SESSION_TABLE's.
        records = [{**raw, "eventSourceARN": self.stream_arn} for raw in reader.read().records]
        if reader.gap_after is not None:
            log.error(
                "records trimmed before they were read", extra={"shardId": reader.shard_id, "after": reader.gap_after}
            )
            reader.gap_after = None
        if records:
            self.sink(records)
            self.count += len(records)
        return len(records)
