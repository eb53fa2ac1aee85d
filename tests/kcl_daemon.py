"""A stand-in for the KCL MultiLangDaemon: drives ``cleanup-worker kcl`` over the multilang JSON-lines protocol.

Like the real daemon it sends one message, answers the child's checkpoint requests, and waits for the status that
acknowledges the message; a status for any other action fails the test. Every stdout line the child writes is kept and
must be a protocol message (JSON with an ``action``); blank lines are allowed, as amazon_kclpy frames its lines with
them. Checkpoint answers can carry injected errors (``ThrottlingException``, ``ShutdownException``...).

Also here: records as Kinesis Data Streams for DynamoDB delivers them, built from DynamoDB Streams records, to the
KCL (multilang ``record`` messages) and to Lambda (an ``aws:kinesis`` event).
"""

from __future__ import annotations

import base64
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SHARD_END = "SHARD_END"
REPLY_TIMEOUT_SECONDS = 60.0  # a hang guard only: a silent child fails the test instead of blocking it
FIRST_SEQUENCE = 49_650_000_000_000_000_000_000_000_000_000_000_000_000_000_000


def kinesis_payload(record: dict[str, Any], table: str) -> dict[str, Any]:
    """A DynamoDB Streams record (GetRecords JSON) in the Kinesis Data Streams for DynamoDB format.

    The change gains ``tableName`` and ``recordFormat``, its ApproximateCreationDateTime is in milliseconds, and it
    carries no SequenceNumber or StreamViewType (the Kinesis record's own sequence number stands for it).
    """
    change = {k: v for k, v in record["dynamodb"].items() if k not in ("SequenceNumber", "StreamViewType")}
    change["ApproximateCreationDateTime"] = int(float(change["ApproximateCreationDateTime"]) * 1000)
    payload = {k: v for k, v in record.items() if k != "dynamodb"}
    payload.update({"tableName": table, "recordFormat": "application/json", "dynamodb": change})
    identity = record.get("userIdentity")
    if identity:
        payload["userIdentity"] = {"type": identity.get("Type"), "principalId": identity.get("PrincipalId")}
    return payload


class KinesisShard:
    """Numbers records the way a Kinesis shard does (56-digit, increasing sequence numbers); each arrives now, or
    ``arrived_ago`` seconds ago."""

    def __init__(self, arrived_ago: float = 0.0) -> None:
        self.next = FIRST_SEQUENCE
        self.arrived_ago = arrived_ago

    def records(self, payloads: Iterable[Any]) -> list[dict[str, Any]]:
        """Multilang ``record`` messages; a payload that is ``bytes`` is sent as is, anything else as JSON."""
        messages = []
        for payload in payloads:
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.next += 1_000_000
            messages.append(
                {
                    "action": "record",
                    "data": base64.b64encode(data).decode(),
                    "partitionKey": "pk",
                    "sequenceNumber": str(self.next),
                    "subSequenceNumber": 0,
                    "approximateArrivalTimestamp": int((time.time() - self.arrived_ago) * 1000),
                }
            )
        return messages


def lambda_kinesis_event(
    records: list[dict[str, Any]], stream_arn: str, shard_id: str = "shardId-000000000000"
) -> dict[str, Any]:
    """Multilang ``record`` messages (``KinesisShard.records``) as a Lambda Kinesis event source mapping delivers
    them (the shape of the AWS documentation's sample event)."""
    region = stream_arn.split(":")[3]
    return {
        "Records": [
            {
                "kinesis": {
                    "kinesisSchemaVersion": "1.0",
                    "partitionKey": record["partitionKey"],
                    "sequenceNumber": record["sequenceNumber"],
                    "data": record["data"],
                    "approximateArrivalTimestamp": record["approximateArrivalTimestamp"] / 1000,
                },
                "eventSource": "aws:kinesis",
                "eventVersion": "1.0",
                "eventID": f"{shard_id}:{record['sequenceNumber']}",
                "eventName": "aws:kinesis:record",
                "invokeIdentityArn": "arn:aws:iam::123456789012:role/session-cleanup",
                "awsRegion": region,
                "eventSourceARN": stream_arn,
            }
            for record in records
        ]
    }


class FakeDaemon:
    """Runs ``cleanup-worker kcl`` as a subprocess and speaks the daemon's side of the protocol."""

    def __init__(self, env: dict[str, str], stderr_path: Path, shard_id: str = "shardId-000000000000") -> None:
        self.shard_id = shard_id
        self.stdout_lines: list[str] = []
        self.checkpoints: list[str] = []  # every checkpoint the daemon accepted (SHARD_END for an end-of-shard one)
        self.checkpoint_errors: list[str] = []  # answers to give the next checkpoint requests, in order
        self.requests: list[dict[str, Any]] = []  # every checkpoint request, accepted or not
        self.stderr_path = stderr_path
        self._stderr = stderr_path.open("w")
        self._last_delivered: str | None = None
        self._ending_shard = False
        self.child = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", "kcl"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env={**os.environ, **env},
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read_stdout, daemon=True).start()

    # Messages to the child.
    def initialize(self, sequence_number: str | None = None) -> None:
        """The shard's start: its checkpoint, a sentinel (``TRIM_HORIZON``, ``LATEST``), or None."""
        message = {"action": "initialize", "shardId": self.shard_id, "subSequenceNumber": 0}
        self.send({**message, "sequenceNumber": sequence_number})

    def process_records(self, records: list[dict[str, Any]]) -> None:
        if records:
            self._last_delivered = records[-1]["sequenceNumber"]
        self.send({"action": "processRecords", "records": records, "millisBehindLatest": 0})

    def shard_ended(self) -> None:
        self._ending_shard = True
        self.send({"action": "shardEnded"})

    def shutdown_requested(self) -> None:
        self.send({"action": "shutdownRequested"})

    def lease_lost(self) -> None:
        self.send({"action": "leaseLost"})

    def send(self, message: dict[str, Any]) -> None:
        """Send one message, answer checkpoints, and return once the child acknowledges it with a status."""
        self.post(message)
        self.await_status(message["action"])

    def post(self, message: dict[str, Any]) -> None:
        """Send one message without waiting for its status."""
        assert self.child.stdin is not None
        self.child.stdin.write(json.dumps(message) + "\n")
        self.child.stdin.flush()

    def await_status(self, action: str) -> None:
        while True:
            message = self.next_message()
            if message["action"] == "checkpoint":
                self.answer_checkpoint(message)
                continue
            assert message == {"action": "status", "responseFor": action}, f"expected the status for {action}"
            return

    def next_message(self) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=REPLY_TIMEOUT_SECONDS)
        except queue.Empty:
            raise AssertionError(f"no answer from the child; its stderr:\n{self.stderr()}") from None
        if line is None:
            raise AssertionError(f"the child closed stdout (exit {self.child.poll()}); its stderr:\n{self.stderr()}")
        message: dict[str, Any] = json.loads(line)
        return message

    def answer_checkpoint(self, request: dict[str, Any]) -> None:
        self.requests.append(request)
        error = self.checkpoint_errors.pop(0) if self.checkpoint_errors else None
        if error is None:
            sequence = request["sequenceNumber"]
            if sequence is None:
                sequence = SHARD_END if self._ending_shard else self._last_delivered
            self.checkpoints.append(sequence)
        self.post(
            {"action": "checkpoint", **{k: request[k] for k in ("sequenceNumber", "subSequenceNumber")}, "error": error}
        )

    # The child's end.
    def close(self) -> int:
        """Close the child's stdin (as the daemon does when it is done with the shard) and wait for it to exit."""
        assert self.child.stdin is not None
        self.child.stdin.close()
        code = self.child.wait(REPLY_TIMEOUT_SECONDS)
        self._stderr.close()
        return code

    def kill(self) -> None:
        self.child.kill()
        self.child.wait(REPLY_TIMEOUT_SECONDS)
        self._stderr.close()

    def stderr(self) -> str:
        if not self._stderr.closed:
            self._stderr.flush()
        return self.stderr_path.read_text()

    def _read_stdout(self) -> None:
        assert self.child.stdout is not None
        for raw in self.child.stdout:
            line = raw.rstrip("\n")
            self.stdout_lines.append(line)
            if line.strip():
                self._lines.put(line)
        self._lines.put(None)
