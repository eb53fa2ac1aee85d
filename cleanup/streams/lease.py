"""The one-consumer lease of a stream: an item of the checkpoint table (``shard`` = ``#lease``: ``owner``, ``version``).

The lease follows the KCL's rule and trusts no other machine's clock: a standby notes the lease's version and takes
it over (a write conditional on that same version) only once the version has not changed for LEASE_SECONDS on its
own clock. The holder renews by bumping the version, conditional on owner and version; a failed renewal, or none for
LEASE_SECONDS, means the lease is lost. Checkpoints are written with ``condition_check()`` in the same transaction,
so a consumer that lost the lease can never move a checkpoint.

The holder dates its term from when it SENT the write that took or renewed the lease, not from when the answer came
back: a standby may have seen the new version before the answer arrived, and counts its LEASE_SECONDS from then. So
the holder's term always ends before a standby can take over, however late the answer.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cleanup.aws.calls import call
from cleanup.exceptions import CleanupError, ConditionFailedError
from cleanup.streams.checkpoint_table import table_call
from cleanup.telemetry import log

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import TransactWriteItemTypeDef

LEASE_SHARD = "#lease"


def owner_name(consumer_id: str | None = None) -> str:
    """This process's name in the lease: the consumer id given (else the host and process id) and a token of its own.

    A holder takes back at once a lease that names it, so two processes of one name (replicas of a copied manifest)
    would both hold it: the token makes every process a different owner, and a restarted one waits, as any standby
    does, for its predecessor's lease to be released or to lapse.
    """
    token = uuid.uuid4().hex[:8]
    return f"{consumer_id}:{token}" if consumer_id else f"{socket.gethostname()}:{os.getpid()}:{token}"


class Lease:
    """This consumer's view of the stream's lease. Thread-safe: a heartbeat thread renews it while the loop is alive."""

    def __init__(
        self,
        dynamodb: DynamoDBClient,
        table: str,
        stream_arn: str,
        owner: str,
        lease_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.owner = owner
        self.lease_seconds = lease_seconds
        self._dynamodb = dynamodb
        self._table = table
        self._key = {"stream": {"S": stream_arn}, "shard": {"S": LEASE_SHARD}}
        self._clock = clock
        self._lock = threading.Lock()
        self._version: int | None = None  # set while held
        self._renewed_at = 0.0
        self._seen: tuple[str, int] | None = None  # another owner's lease, and since when unchanged
        self._seen_at = 0.0

    @property
    def held(self) -> bool:
        """Held, and renewed within LEASE_SECONDS by this process's clock."""
        with self._lock:
            return self._version is not None and self._clock() - self._renewed_at < self.lease_seconds

    def try_acquire(self) -> bool:
        """Take the lease if it is free, released, or has not been renewed for LEASE_SECONDS; False to stand by.

        Raises:
            TransientError: throttling or a server error.
            CheckpointTableError: anything else, e.g. a missing permission.
        """
        with self._lock:
            get = self._dynamodb.get_item
            item = table_call(get, "GetItem", self._table, TableName=self._table, Key=self._key, ConsistentRead=True)
            current = item.get("Item")
            if current is None:
                return self._take(None)
            owner, version = current.get("owner", {}).get("S", ""), int(current["version"]["N"])
            if owner in ("", self.owner):
                return self._take(version)
            now = self._clock()
            if self._seen != (owner, version):
                self._seen, self._seen_at = (owner, version), now
                return False
            if now - self._seen_at < self.lease_seconds:
                return False
            log.warning("taking over the stream lease", extra={"from": owner, "silentSeconds": now - self._seen_at})
            return self._take(version)

    def renew(self) -> bool:
        """Bump the version; False once the lease is lost (taken over, or not renewed in time)."""
        with self._lock:
            if self._version is None:
                return False
            sent = self._clock()
            try:
                self._update_mine("SET version = :next, heartbeatAt = :now", self._values(self._version + 1))
            except ConditionFailedError:
                return self._moved_on()
            except CleanupError as exc:
                log.warning("lease renewal failed; will retry", extra={"error": str(exc)})
                return self._clock() - self._renewed_at < self.lease_seconds
            self._version += 1
            self._renewed_at = sent
            return True

    def _moved_on(self) -> bool:
        """A renewal found the lease at another version: taken over, or moved by a renewal of this holder's own that
        the service applied but whose answer was lost (a read timeout, botocore's retry of it). The caller holds the
        lock. Still this owner's: its version is adopted, and the term still counts from the last renewal answered.
        """
        try:
            get = self._dynamodb.get_item
            item = table_call(get, "GetItem", self._table, TableName=self._table, Key=self._key, ConsistentRead=True)
        except CleanupError as exc:
            log.warning("lease renewal failed; will retry", extra={"error": str(exc)})
            return self._clock() - self._renewed_at < self.lease_seconds
        current = item.get("Item") or {}
        if current.get("owner", {}).get("S") == self.owner:  # a token of this process's own: no one else's write
            self._version = int(current["version"]["N"])
            log.info("the stream lease moved on by a renewal whose answer was lost", extra={"owner": self.owner})
            return self._clock() - self._renewed_at < self.lease_seconds
        log.error("the stream lease was taken over", extra={"owner": self.owner})
        self._version = None
        return False

    def renew_if_due(self) -> bool:
        """Renew when a third of the term has passed; False once the lease is lost."""
        with self._lock:
            due = self._version is not None and self._clock() - self._renewed_at >= self.lease_seconds / 3
        return self.renew() if due else self.held

    def release(self) -> None:
        """Give the lease up (owner cleared), so a standby takes over at once instead of after LEASE_SECONDS."""
        with self._lock:
            if self._version is None:
                return
            try:
                values = {**self._values(self._version + 1), ":none": {"S": ""}}
                self._update_mine("SET #owner = :none, version = :next, heartbeatAt = :now", values)
            except CleanupError as exc:
                log.warning("could not release the stream lease; it will expire", extra={"error": str(exc)})
            self._version = None

    def mark_lost(self) -> None:
        """Note that a fenced write found another owner: the lease is gone, and not to be released."""
        with self._lock:
            self._version = None

    def condition_check(self) -> TransactWriteItemTypeDef:
        """A TransactWriteItems ConditionCheck that this consumer still owns the lease."""
        return {
            "ConditionCheck": {
                "TableName": self._table,
                "Key": self._key,
                "ConditionExpression": "#owner = :me",
                "ExpressionAttributeNames": {"#owner": "owner"},
                "ExpressionAttributeValues": {":me": {"S": self.owner}},
            }
        }

    def _take(self, version: int | None) -> bool:
        condition = "attribute_not_exists(version)" if version is None else "version = :seen"
        values: dict[str, Any] = {":me": {"S": self.owner}, ":next": {"N": str((version or 0) + 1)}}
        if version is not None:
            values[":seen"] = {"N": str(version)}
        sent = self._clock()
        try:
            table_call(
                self._dynamodb.update_item,
                "UpdateItem",
                self._table,
                TableName=self._table,
                Key=self._key,
                UpdateExpression="SET #owner = :me, version = :next",
                ConditionExpression=condition,
                ExpressionAttributeNames={"#owner": "owner"},
                ExpressionAttributeValues=values,
            )
        except ConditionFailedError:
            return False  # another standby was quicker
        self._version, self._renewed_at, self._seen = (version or 0) + 1, sent, None
        log.info("holding the stream lease", extra={"owner": self.owner, "version": self._version})
        return True

    def _update_mine(self, update: str, values: dict[str, Any]) -> None:
        """Update the lease on condition that this consumer still holds it, at the version it knows."""
        call(
            self._dynamodb.update_item,
            "UpdateItem",
            None,
            TableName=self._table,
            Key=self._key,
            UpdateExpression=update,
            ConditionExpression="#owner = :me AND version = :mine",
            ExpressionAttributeNames={"#owner": "owner"},
            ExpressionAttributeValues=values,
        )

    def _values(self, next_version: int) -> dict[str, Any]:
        assert self._version is not None
        return {
            ":me": {"S": self.owner},
            ":mine": {"N": str(self._version)},
            ":next": {"N": str(next_version)},
            ":now": {"N": str(int(time.time()))},
        }


class Heartbeat:
    """Renews a lease on a thread of its own, so that a long batch cannot outlive the lease, but only while the
    consumer's loop is alive (``alive()``, e.g. ``Progress.fresh``): a wedged loop lets the lease lapse, and a standby
    takes it over LEASE_SECONDS after the last renewal, which comes at most the loop's staleness bound (plus a sixth of
    LEASE_SECONDS, this thread's tick) after the loop last came round."""

    def __init__(self, lease: Lease, alive: Callable[[], bool] = lambda: True) -> None:
        self._lease = lease
        self._alive = alive
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def tick(self) -> bool:
        """Renew if due and the loop is alive; False once the lease is lost (never renewed again by this thread)."""
        if not self._alive():
            return True  # not renewed: the lease lapses unless the loop comes back in time; the loop checks it
        return self._lease.renew_if_due()

    def _run(self) -> None:
        while not self._stop.wait(self._lease.lease_seconds / 6) and self.tick():
            pass
