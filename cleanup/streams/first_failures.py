"""When a shard's failing records were first tried, kept where the next process finds them (CHECKPOINT_TABLE).

A record is given up once it has been failing for MAX_RECORD_RETRY_SECONDS. Kept in memory only, that clock would
start again from zero in every process that receives the record: a consumer restarted (by its health check, a
deployment, a crash) more often than the bound would never give the record up, and its shard would wait on it for as
long as the dependency fails. The KCL record processor therefore writes the first-try time of each record it leaves
failing, and a processor that receives the record again gives it up on that clock.

Items (in the checkpoint table, beside the poller's checkpoints; hash key ``stream``, range key ``shard``):
``stream`` = ``failing#<scope>#<shard id>`` (the scope names the stream's source, e.g. the session table),
``shard`` = the record's id (sequence number, with its sub-sequence number), ``firstTriedAt`` (epoch seconds), and
``expiresAt`` (epoch seconds, the table's TTL attribute: a day of stream retention and MAX_RECORD_RETRY_SECONDS after
the first try, when the stream can no longer deliver the record and its give-up bound has run out). An item is
written once, when its record first fails (a later write never moves the time), and deleted once the record is done
(cleaned, skipped or dead-lettered); one left behind (a shard given to a processor elsewhere, a delete that failed)
expires. Nothing is written for a record that is clean at its first try.

The table failing never stops the cleaning: a time not yet read or written leaves the record on this process's own
clock, which starts later, so the record is held longer, never given up sooner. A failure is logged.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from cleanup.exceptions import CleanupError
from cleanup.streams.checkpoint_table import ensure_table, table_call, table_call_or_gone
from cleanup.streams.retry_in_place import InPlaceBatch
from cleanup.telemetry import log

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

    from schemas.settings import Settings

CLOCK = time.time
"""The clock of a batch whose first-try times are kept: wall-clock seconds, comparable across processes."""
STREAM_RETENTION_SECONDS = 24 * 3600
"""How long a stream (DynamoDB Streams, Kinesis by default) keeps a record: after that no one delivers it again."""


class FirstFailures:
    """The first-try times of one shard's failing records, in the checkpoint table."""

    def __init__(self, dynamodb: DynamoDBClient, settings: Settings, scope: str, shard_id: str) -> None:
        self._dynamodb = dynamodb
        self._table = settings.checkpoint_table
        self._keep_seconds = STREAM_RETENTION_SECONDS + settings.max_record_retry_seconds
        self._partition = f"failing#{scope}#{shard_id}"
        self._ready = False

    def recall(self) -> dict[str, float]:
        """Every failing record's first-try time (one Query, paged).

        Raises:
            TransientError: throttling or a server error.
            CheckpointTableError: anything else, e.g. a missing permission.
        """
        self._ensure_table()
        times: dict[str, float] = {}
        kwargs: dict[str, object] = {
            "TableName": self._table,
            "KeyConditionExpression": "#s = :s",
            "ExpressionAttributeNames": {"#s": "stream"},
            "ExpressionAttributeValues": {":s": {"S": self._partition}},
            "ConsistentRead": True,
        }
        while True:
            page = table_call(self._dynamodb.query, "Query", self._table, **kwargs)  # type: ignore[arg-type]
            for item in page.get("Items", []):
                times[item["shard"]["S"]] = float(item["firstTriedAt"]["N"])
            if "LastEvaluatedKey" not in page:
                return times
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def note(self, record: str, first_tried_at: float) -> None:
        """Keep ``record``'s first-try time, unless one is kept already (raises as ``recall``)."""
        self._ensure_table()
        item = {
            "stream": {"S": self._partition},
            "shard": {"S": record},
            "firstTriedAt": {"N": repr(first_tried_at)},
            "expiresAt": {"N": str(math.ceil(first_tried_at + self._keep_seconds))},
        }
        table_call_or_gone(
            self._dynamodb.put_item,
            "PutItem",
            self._table,
            ("ConditionalCheckFailedException",),  # kept already: the earlier time stands
            TableName=self._table,
            Item=item,
            ConditionExpression="attribute_not_exists(#s)",
            ExpressionAttributeNames={"#s": "shard"},
        )

    def forget(self, record: str) -> None:
        """Delete ``record``'s time: it is done (raises as ``recall``)."""
        key = {"stream": {"S": self._partition}, "shard": {"S": record}}
        table_call(self._dynamodb.delete_item, "DeleteItem", self._table, TableName=self._table, Key=key)

    def _ensure_table(self) -> None:
        if not self._ready:
            ensure_table(self._dynamodb, self._table)
            self._ready = True


class GiveUpClock:
    """Runs a batch's give-up clock from the first-try times kept by earlier processes, and keeps its own."""

    def __init__(self, store: FirstFailures | None, **where: str) -> None:
        """``store`` None: the clock lives in memory only (a dry run, which gives nothing up)."""
        self._store = store
        self._where = where
        self._known: dict[str, float] = {}  # kept in the table (recalled, or noted by this process)
        self._recalled = store is None

    def before(self, batch: InPlaceBatch) -> None:
        """Before an attempt: the batch's records start their clocks where the kept times say."""
        batch.remember(self._known)

    def after(self, batch: InPlaceBatch) -> None:
        """After an attempt: keep the times of records newly failing, and forget those of records now done.

        The kept times are read once, when a record first fails here: a shard whose records are clean at their first
        try costs no call. A record failing under an earlier process is thus given up at this process's second
        attempt at the latest.
        """
        if self._store is None:
            return
        failing = batch.failing_since
        if failing and not self._recalled:
            try:
                self._known.update(self._store.recall())
                self._recalled = True
            except CleanupError as exc:
                self._warn("failing records' first-try times not read; read again after the next attempt", exc)
            batch.remember(self._known)
            failing = batch.failing_since
        for record, at in failing.items():
            if record not in self._known:
                try:
                    self._store.note(record, at)
                except CleanupError as exc:
                    self._warn("first-try time not kept; kept at the next attempt", exc, record)
                    continue
                self._known[record] = at
        done = {r.sequence_number for r in batch.records} & self._known.keys() - failing.keys()
        for record in sorted(done):
            try:
                self._store.forget(record)
            except CleanupError as exc:  # left behind: the record is done, its time is never read for it again
                self._warn("first-try time of a record now done not deleted", exc, record)
            del self._known[record]

    def _warn(self, what: str, exc: CleanupError, record: str | None = None) -> None:
        extra = {**self._where, "error": str(exc)}
        if record is not None:
            extra["sequenceNumber"] = record
        log.warning(what, extra=extra)
