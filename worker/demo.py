"""``cleanup-worker demo``: the whole worker on a local stack, end to end, in well under a minute.

Starts an embedded moto server and a local WebSocket gateway on loopback; creates the session table (TTL, a
NEW_AND_OLD_IMAGES stream and the sweeper's expiry index), the scratch bucket, a KMS key and a room registry (one
item per room membership of a connection, rooms sharded over several partitions, an index on the connection id);
opens real WebSocket clients and creates their sessions (item, connection, grant, scratch objects), each connection
joining a few rooms. Then some sessions expire by TTL
(simulated: moto has no TTL process), some are ended explicitly, some have a ttl in the past and are left to the
sweeper, and some stay live. The stream poller runs until the stream is drained; the demo then checks every session
against what must have happened, prints a table and a summary, and exits 1 if anything is left unclean or any live
session was touched.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import zlib
from typing import Any

from worker.demo_report import DemoSession as DemoSession
from worker.demo_report import OutcomeLog as OutcomeLog
from worker.demo_report import poll_line as poll_line
from worker.demo_report import report
from worker.demo_report import sweep_line as sweep_line

PLAN = (("ttl", 4), ("explicit", 3), ("sweep", 3), ("live", 2))
ROOMS = ("lobby", "support", "ops", "sales", "design", "random")
ROOMS_PER_CONNECTION = 3
ROOM_SHARDS = 4  # each room spread over this many partition keys


PRESETS = ("sessions", "connection-table")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset",
        choices=PRESETS,
        default="sessions",
        help="sessions: a session table whose sessions hold a socket, a grant, scratch data and rooms (default); "
        "connection-table: a conn#<id> / metadata / expires_at table whose sessions hold a socket alone",
    )
    parser.add_argument("--objects", type=int, default=40, help="scratch objects per session (default 40)")
    parser.add_argument("--verbose", action="store_true", help="also show the worker's JSON logs on stderr")


def main(args: argparse.Namespace) -> int:
    from schemas.settings import Settings
    from worker.local.backend import LocalAws
    from worker.local.gateway import LocalGateway

    started = time.monotonic()
    settings = Settings.from_env()  # before anything starts: a bad setting ends the demo at once, in one line
    progress("starting moto and the WebSocket gateway on 127.0.0.1")
    with LocalAws() as aws, LocalGateway() as gateway:
        aws.use()
        if args.preset == "connection-table":
            from worker.demo_connections import ConnectionDemo

            return ConnectionDemo(aws, gateway, progress).run(started, settings)
        return Demo(aws, gateway, objects=args.objects, verbose=args.verbose).run(started, settings)


def progress(message: str) -> None:
    print(f"[demo] {message}", file=sys.stderr, flush=True)


class Demo:
    def __init__(self, aws: Any, gateway: Any, *, objects: int, verbose: bool) -> None:
        import boto3

        self.aws, self.gateway, self.objects, self.verbose = aws, gateway, objects, verbose
        self.ddb = boto3.client("dynamodb")
        self.s3 = boto3.client("s3")
        self.kms = boto3.client("kms")
        self.table, self.bucket, self.registry = "demo-sessions", "demo-scratch", "demo-registry"
        self.sessions: list[DemoSession] = []

    def run(self, started: float, environment: Any) -> int:
        """Run the demo with the settings read from ``environment``, pointed at the local stack."""
        from cleanup.runtime import Runtime
        from cleanup.telemetry import configure_logging, log

        stream_arn, key_arn = self.create_stack()
        settings = environment.model_copy(
            update={
                "scratch_bucket": self.bucket,
                "kms_key_id": key_arn,
                "ws_callback_url": self.gateway.callback_url,
                "session_table": self.table,
                "registry_table": self.registry,
                "expiry_index": "expiry-index",
                "checkpoint_table": f"{self.table}-checkpoints",
                "poll_interval_seconds": 0.05,
                "metrics_destination": "off",
            }
        )
        configure_logging(settings)
        log.handlers[0].setLevel(logging.INFO if self.verbose else logging.WARNING)
        outcomes = OutcomeLog()
        log.addHandler(outcomes)
        runtime = Runtime(settings)
        try:
            self.create_sessions(key_arn, settings)
            self.end_sessions(runtime)
            self.consume(runtime, stream_arn)
            self.observe(key_arn, outcomes)
        finally:
            runtime.close()
            for session in self.sessions:
                session.client.close()
        return report(self.sessions, time.monotonic() - started)

    def create_stack(self) -> tuple[str, str]:
        progress("creating the session table (TTL, NEW_AND_OLD_IMAGES stream, expiry index), bucket, KMS key")
        progress("creating the room registry (rooms sharded over several partitions, an index on the connection id)")
        from worker.local.backend import create_registry_table, create_session_table

        stream_arn = create_session_table(self.ddb, self.table, expiry_index="expiry-index")
        create_registry_table(self.ddb, self.registry)
        self.s3.create_bucket(Bucket=self.bucket)
        key_arn = self.kms.create_key(Description="demo session grants")["KeyMetadata"]["Arn"]
        return str(stream_arn), str(key_arn)

    def create_sessions(self, key_arn: str, settings: Any) -> None:
        from cleanup.application_contract import create_session, create_session_grant

        total = sum(count for _, count in PLAN)
        progress(
            f"opening {total} WebSocket clients, creating their sessions ({self.objects} objects each) and joining "
            f"each connection to {ROOMS_PER_CONNECTION} of {len(ROOMS)} rooms"
        )
        for fate, count in PLAN:
            for n in range(count):
                session_id = f"{fate}-{n + 1}"
                tenant = f"tenant-{n % 2 + 1}"
                prefix = f"sessions/{tenant}/{session_id}/"
                client = self.gateway.connect()
                grant_id = create_session_grant(
                    self.kms,
                    key_arn,
                    session_id,
                    grantee=f"arn:aws:iam::123456789012:role/agent-{session_id}",
                    operations=["Decrypt"],
                    retiring_principal="arn:aws:iam::123456789012:role/session-cleanup",
                )
                for i in range(self.objects):
                    self.s3.put_object(Bucket=self.bucket, Key=f"{prefix}scratch-{i:04d}.json", Body=b"{}")
                # Sessions bound for TTL or the sweeper get a ttl already in the past.
                ttl_seconds = -120 if fate in ("ttl", "sweep") else 3600
                create_session(
                    self.ddb,
                    self.table,
                    session_id,
                    tenant_id=tenant,
                    scratch_prefix=prefix,
                    ttl_seconds=ttl_seconds,
                    connection_id=client.connection_id,
                    grant_id=grant_id,
                    names=settings.attributes,
                    bucket_seconds=settings.expiry_bucket_seconds,
                )
                session = DemoSession(session_id, fate, tenant, prefix, grant_id, client, self.objects)
                self.join_rooms(session, len(self.sessions))
                self.sessions.append(session)

    def join_rooms(self, session: DemoSession, number: int) -> None:
        """The session's connection joins a few rooms, in the partition its connection id hashes to."""
        from worker.local.backend import join_room

        connection_id = session.client.connection_id
        shard = zlib.crc32(connection_id.encode()) % ROOM_SHARDS
        for k in range(ROOMS_PER_CONNECTION):
            room = ROOMS[(number + k) % len(ROOMS)]
            join_room(
                self.ddb,
                self.registry,
                room,
                connection_id,
                user_id=f"user-{session.session_id}",
                shard=shard,
                session_id=session.session_id,
            )
        session.rooms = ROOMS_PER_CONNECTION

    def end_sessions(self, runtime: Any) -> None:
        from cleanup.application_contract import end_session, session_key
        from cleanup.expiry.sweeper import sweep

        ttl = [s for s in self.sessions if s.fate == "ttl"]
        progress(f"expiring {len(ttl)} sessions by TTL (a TTL delete, userIdentity dynamodb.amazonaws.com)")
        for session in ttl:
            self.aws.expire_by_ttl(self.table, session_key(session.session_id, runtime.settings.attributes))
        explicit = [s for s in self.sessions if s.fate == "explicit"]
        progress(f"ending {len(explicit)} sessions explicitly (logout)")
        for session in explicit:
            end_session(self.ddb, self.table, session.session_id, names=runtime.settings.attributes)
        report = sweep(runtime, table=self.table)
        progress(f"sweeper: {sweep_line(report.summary())}")

    def consume(self, runtime: Any, stream_arn: str) -> None:
        from cleanup.streams.poller import StreamPoller

        progress("stream poller: consuming the table's stream until it is drained")
        summary = StreamPoller(runtime, stream_arn, consumer_id="demo").run(until_idle=True)
        progress(f"stream poller: {poll_line(summary.as_dict())}")

    def observe(self, key_arn: str, outcomes: OutcomeLog) -> None:
        for session in self.sessions:
            session.socket_closed = session.client.wait_closed(2.0 if session.fate != "live" else 0.0)
        grants = {g["GrantId"] for g in self.kms.list_grants(KeyId=key_arn)["Grants"]}
        memberships = self.memberships()
        for session in self.sessions:
            session.rooms_left = memberships.get(session.client.connection_id, 0)
            session.grant_retired = session.grant_id not in grants
            listed = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=session.prefix)
            session.objects_left = listed.get("KeyCount", 0)
            session.reason = next(
                (reason for key, reason in outcomes.reasons.items() if f"pk=session#{session.session_id}," in key),
                None,
            )

    def memberships(self) -> dict[str, int]:
        """How many room memberships each connection still has in the registry (read from the table itself)."""
        counts: dict[str, int] = {}
        for page in self.ddb.get_paginator("scan").paginate(TableName=self.registry, ConsistentRead=True):
            for item in page["Items"]:
                connection_id = item["connectionId"]["S"]
                counts[connection_id] = counts.get(connection_id, 0) + 1
        return counts
