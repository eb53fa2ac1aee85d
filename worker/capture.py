"""``cleanup-worker capture``: write a DynamoDB stream's records to a file, one JSON object per line, losslessly.

Each line is a record exactly as GetRecords sent it (base64 binary, epoch-seconds times), which ``replay`` reads
back. Parent shards are read before their children, so an item's records stay in stream order in the file. Without
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
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from botocore.exceptions import BotoCoreError, ClientError

from cleanup.aws_errors import error_code
from cleanup.clients import Clients
from cleanup.streams.reader import raw_get_records
from schemas.records import sequence_number_of
from schemas.settings import Settings

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EMPTY_READS_AT_END = 3  # an open shard can answer empty before its newest records; a few empty reads end it


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--table-name", help="the table whose latest stream to read")
    source.add_argument("--stream-arn", help="the stream to read")
    parser.add_argument("--from", dest="start", choices=("trim-horizon", "latest"), default="trim-horizon")
    parser.add_argument("--follow", action="store_true", help="keep reading new records until interrupted")
    parser.add_argument("--out", required=True, type=Path, metavar="FILE.jsonl", help="where to write the records")


def main(args: argparse.Namespace) -> int:
    """Capture the stream named on the command line into ``args.out``."""
    settings = Settings.from_env()
    clients = Clients(settings)
    streams = clients.get("dynamodbstreams")
    try:
        stream_arn = args.stream_arn or latest_stream(clients.dynamodb, args.table_name)
        stop = threading.Event()
        if args.follow:
            _stop_on_signals(stop)
        with args.out.open("w", encoding="utf-8") as out:
            capture = Capture(streams, stream_arn, args.start.upper().replace("-", "_"), _writer(out))
            capture.run(follow=args.follow, stop=stop, poll_seconds=settings.poll_interval_seconds)
    except StreamNotFound as exc:
        print(f"cleanup-worker capture: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (ClientError, BotoCoreError) as exc:
        print(f"cleanup-worker capture: {exc}", file=sys.stderr)
        return EXIT_FAILED
    shards = len(capture.shards)
    print(f"captured {capture.count} records from {shards} shard{'s' * (shards != 1)} of {stream_arn} into {args.out}")
    return EXIT_OK


class StreamNotFound(LookupError):
    """The table has no stream, or the stream does not exist."""


def latest_stream(dynamodb: Any, table: str) -> str:
    """The ARN of ``table``'s current stream."""
    try:
        description = dynamodb.describe_table(TableName=table)["Table"]
    except ClientError as exc:
        if error_code(exc) == "ResourceNotFoundException":
            raise StreamNotFound(f"table {table!r} does not exist") from exc
        raise
    arn = description.get("LatestStreamArn")
    if not arn or not description.get("StreamSpecification", {}).get("StreamEnabled"):
        raise StreamNotFound(f"table {table!r} has no stream enabled")
    return str(arn)


def _writer(out: IO[str]) -> Callable[[list[dict[str, Any]]], None]:
    def write(records: list[dict[str, Any]]) -> None:
        out.writelines(json.dumps(record, separators=(",", ":")) + "\n" for record in records)
        out.flush()  # a followed capture that is killed keeps every page it read

    return write


def _stop_on_signals(stop: threading.Event) -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())


@dataclass
class _Shard:
    shard_id: str
    parent: str | None
    iterator: str | None = None
    last: str | None = None
    empty_reads: int = 0
    closed: bool = False


class Capture:
    """Reads every shard of one stream, parents before children, handing each page's raw records to ``sink``."""

    def __init__(self, streams: Any, stream_arn: str, start: str, sink: Callable[[list[dict[str, Any]]], None]) -> None:
        self.streams, self.stream_arn, self.start, self.sink = streams, stream_arn, start, sink
        self.shards: dict[str, _Shard] = {}
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
            read = sum(self._read(shard) for shard in self._ready(follow))
            if not follow and all(self._drained(shard) for shard in self.shards.values()):
                return
            if not read:
                stop.wait(poll_seconds)

    def discover(self) -> None:
        """Add the stream's shards not seen yet (DescribeStream, every page)."""
        kwargs: dict[str, Any] = {"StreamArn": self.stream_arn}
        while True:
            try:
                description = self.streams.describe_stream(**kwargs)["StreamDescription"]
            except ClientError as exc:
                if error_code(exc) == "ResourceNotFoundException":
                    raise StreamNotFound(f"stream {self.stream_arn} does not exist") from exc
                raise
            for shard in description.get("Shards", []):
                self.shards.setdefault(shard["ShardId"], _Shard(shard["ShardId"], shard.get("ParentShardId")))
            last = description.get("LastEvaluatedShardId")
            if not last:
                return
            kwargs["ExclusiveStartShardId"] = last

    def _ready(self, follow: bool) -> list[_Shard]:
        # A child waits until its parent (if still in the stream) is read to its end.
        return [
            shard
            for shard in self.shards.values()
            if not shard.closed
            and (follow or not self._drained(shard))
            and (shard.parent not in self.shards or self.shards[shard.parent].closed)
        ]

    @staticmethod
    def _drained(shard: _Shard) -> bool:
        return shard.closed or shard.empty_reads >= EMPTY_READS_AT_END

    def _read(self, shard: _Shard) -> int:
        if shard.iterator is None:
            shard.iterator = self._iterator(shard)
        try:
            page = raw_get_records(self.streams, shard.iterator)
        except ClientError as exc:
            if error_code(exc) != "ExpiredIteratorException":
                raise
            shard.iterator = self._iterator(shard)  # resume after the last record written
            return 0
        records = page.get("Records", [])
        shard.iterator = page.get("NextShardIterator")
        shard.closed = shard.iterator is None
        shard.empty_reads = 0 if records else shard.empty_reads + 1
        if records:
            self.sink(records)
            self.count += len(records)
            shard.last = sequence_number_of(records[-1]) or shard.last
        return len(records)

    def _iterator(self, shard: _Shard) -> str:
        kwargs: dict[str, Any] = {"StreamArn": self.stream_arn, "ShardId": shard.shard_id}
        if shard.last:
            kwargs.update(ShardIteratorType="AFTER_SEQUENCE_NUMBER", SequenceNumber=shard.last)
        elif shard.parent in self.shards:
            kwargs["ShardIteratorType"] = "TRIM_HORIZON"  # a child is read whole, whatever --from said
        else:
            kwargs["ShardIteratorType"] = self.start
        return str(self.streams.get_shard_iterator(**kwargs)["ShardIterator"])
