"""``cleanup-worker demo --preset connection-table``: the worker on a connection table, sockets only.

The table is keyed ``pk = conn#<id>``, ``sk = metadata``, TTL on ``expires_at``, as a connection gateway writes it;
each connection also has subscription rows in its partition. The worker runs as the socket-only example configures it
(ACTIONS=connection, the id read from the key by CONNECTION_ID_PATTERN, only the metadata row a session), with the
sweeper on an expiry index over ``expires_at`` (docs/configure.md, "A sweeper for a connection table"). Some
connections expire by TTL, some are closed by the application (every row deleted), some are past their
``expires_at`` and left to the sweeper, and some stay live. The demo checks that every ended connection's socket is
closed, that the live ones are open, and that no subscription row of a live connection was deleted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from worker.demo_report import EXPECTED_REASON, OutcomeLog, poll_line, sweep_line
from worker.exit_codes import ExitCode

PLAN = (("ttl", 3), ("explicit", 2), ("sweep", 2), ("live", 2))
ROOMS = ("lobby", "support")
TABLE = "demo-connections"
SHAPE = {
    "actions": "connection",
    "session_key_prefix": "conn#",
    "session_sort_key": "metadata",
    "connection_id_pattern": "^conn#(?P<id>.+)$",
    "expiry_index": "expiry-index",
}


@dataclass
class Connection:
    """One connection of the demo and what became of it."""

    fate: str
    client: Any = field(repr=False)
    reason: str | None = None
    socket_closed: bool = False
    rows_left: int = 0

    @property
    def key(self) -> str:
        return f"conn#{self.client.connection_id}"

    @property
    def ok(self) -> bool:
        if self.fate == "live":
            return not self.socket_closed and self.rows_left == 1 + len(ROOMS)
        return self.socket_closed and self.reason == EXPECTED_REASON[self.fate]


class ConnectionDemo:
    """The preset, on the demo's local stack."""

    def __init__(self, aws: Any, gateway: Any, progress: Any) -> None:
        import boto3

        self.aws, self.gateway, self.progress = aws, gateway, progress
        self.ddb = boto3.client("dynamodb")
        self.connections: list[Connection] = []

    def run(self, started: float, environment: Any) -> int:
        from cleanup.actions.loading import load_kinds
        from cleanup.runtime import Runtime
        from cleanup.telemetry import configure_logging, log

        stream_arn = self.create_table()
        names = environment.attributes.model_copy(update={"connection_id": "pk", "ttl": "expires_at"})
        update = {key: value for key, value in SHAPE.items() if key != "actions"}
        settings = environment.model_copy(
            update={
                **update,
                "attributes": names,
                "ws_callback_url": self.gateway.callback_url,
                "session_table": TABLE,
                "checkpoint_table": f"{TABLE}-checkpoints",
                "poll_interval_seconds": 0.05,
                "metrics_destination": "off",
            }
        )
        configure_logging(settings)
        log.handlers[0].setLevel("WARNING")
        outcomes = OutcomeLog()
        log.addHandler(outcomes)
        runtime = Runtime(settings, kinds=load_kinds(SHAPE["actions"]))  # ACTIONS=connection, as deployed
        try:
            self.open_connections(settings)
            self.end_connections(runtime)
            self.consume(runtime, stream_arn)
            self.observe(outcomes)
        finally:
            runtime.close()
            for connection in self.connections:
                connection.client.close()
        return self.report(time.monotonic() - started)

    def create_table(self) -> str:
        self.progress("creating the connection table (pk conn#<id>, sk metadata, TTL on expires_at, expiry index)")
        described = self.ddb.create_table(
            TableName=TABLE,
            AttributeDefinitions=[
                {"AttributeName": "pk", "AttributeType": "S"},
                {"AttributeName": "sk", "AttributeType": "S"},
                {"AttributeName": "expiryBucket", "AttributeType": "S"},
                {"AttributeName": "expires_at", "AttributeType": "N"},
            ],
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            BillingMode="PAY_PER_REQUEST",
            StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
            GlobalSecondaryIndexes=[
                {
                    "IndexName": "expiry-index",
                    "KeySchema": [
                        {"AttributeName": "expiryBucket", "KeyType": "HASH"},
                        {"AttributeName": "expires_at", "KeyType": "RANGE"},
                    ],
                    "Projection": {"ProjectionType": "KEYS_ONLY"},
                }
            ],
        )["TableDescription"]
        self.ddb.update_time_to_live(
            TableName=TABLE, TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires_at"}
        )
        return str(described["LatestStreamArn"])

    def open_connections(self, settings: Any) -> None:
        from schemas.convention import expiry_bucket

        total = sum(count for _, count in PLAN)
        self.progress(f"opening {total} WebSocket clients, each a metadata row and {len(ROOMS)} subscription rows")
        for fate, count in PLAN:
            for _ in range(count):
                connection = Connection(fate, self.gateway.connect())
                expires = int(time.time()) + (-120 if fate in ("ttl", "sweep") else 600)
                row = {"pk": {"S": connection.key}, "sk": {"S": "metadata"}, "expires_at": {"N": str(expires)}}
                bucket = expiry_bucket(expires, bucket_seconds=settings.expiry_bucket_seconds)
                row["expiryBucket"] = {"S": bucket}  # what the gateway adds for the sweeper
                self.ddb.put_item(TableName=TABLE, Item=row)
                for room in ROOMS:
                    subscription = {"pk": {"S": connection.key}, "sk": {"S": f"subscription#{room}"}}
                    self.ddb.put_item(TableName=TABLE, Item={**subscription, "expires_at": {"N": str(expires)}})
                self.connections.append(connection)

    def end_connections(self, runtime: Any) -> None:
        from cleanup.expiry.sweeper import sweep

        ttl = [c for c in self.connections if c.fate == "ttl"]
        self.progress(f"expiring {len(ttl)} metadata rows by TTL")
        for connection in ttl:
            self.aws.expire_by_ttl(TABLE, {"pk": {"S": connection.key}, "sk": {"S": "metadata"}})
        explicit = [c for c in self.connections if c.fate == "explicit"]
        self.progress(f"closing {len(explicit)} connections from the application (every row of each deleted)")
        for connection in explicit:
            for sort_key in ("metadata", *(f"subscription#{room}" for room in ROOMS)):
                self.ddb.delete_item(TableName=TABLE, Key={"pk": {"S": connection.key}, "sk": {"S": sort_key}})
        report = sweep(runtime, table=TABLE)
        self.progress(f"sweeper: {sweep_line(report.summary())}")

    def consume(self, runtime: Any, stream_arn: str) -> None:
        from cleanup.streams.poller import StreamPoller

        self.progress("stream poller: consuming the table's stream until it is drained")
        summary = StreamPoller(runtime, stream_arn, consumer_id="demo").run(until_idle=True)
        self.progress(f"stream poller: {poll_line(summary.as_dict())}")

    def observe(self, outcomes: OutcomeLog) -> None:
        for connection in self.connections:
            connection.socket_closed = connection.client.wait_closed(2.0 if connection.fate != "live" else 0.0)
            rows = self.ddb.query(
                TableName=TABLE,
                KeyConditionExpression="pk = :pk",
                ExpressionAttributeValues={":pk": {"S": connection.key}},
                ConsistentRead=True,
            )
            connection.rows_left = len(rows["Items"])
            connection.reason = next(
                (reason for key, reason in outcomes.reasons.items() if f"pk={connection.key}," in key), None
            )

    def report(self, elapsed: float) -> int:
        header = f"{'connection':<24} {'fate':<9} {'reason':<9} {'socket':<8} {'rows left':<10} ok"
        print(header)
        print("-" * len(header))
        for c in self.connections:
            print(
                f"{c.key:<24} {c.fate:<9} {c.reason or '-':<9} {'closed' if c.socket_closed else 'open':<8} "
                f"{c.rows_left:<10} {'yes' if c.ok else 'NO'}"
            )
        bad = [c.key for c in self.connections if not c.ok]
        ended = [c for c in self.connections if c.fate != "live"]
        live = [c for c in self.connections if c.fate == "live"]
        print(
            f"\n{sum(c.ok for c in ended)}/{len(ended)} ended connections' sockets closed, "
            f"{sum(c.ok for c in live)} live connections untouched, {len(bad)} problems, in {elapsed:.1f} s"
        )
        if bad:
            print(f"NOT CLEAN: {', '.join(bad)}")
        return ExitCode.FAILED if bad else ExitCode.OK
