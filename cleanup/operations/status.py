"""The worker's state at a glance, gathered with read-only calls and the worker's own settings.

* the mode in force: CLEANUP_MODE and the kill switch (read through the local agent, as the worker reads it);
* the stream poller: each shard's checkpoint (or a LATEST start's pin), its lag (records waiting after the checkpoint
  or from the pin, and the age of the first of them: a bounded read of at most ``LAG_PAGES`` GetRecords pages), and
  the stream lease's holder and term (one Query of the checkpoint table). A checkpoint the stream has trimmed past is
  shown as the loss it is (``lost``: after the checkpoint, before the first record still there), not as a lag; a
  waiting record past half the stream's retention carries a ``warning``. The table's earlier streams with unfinished
  checkpoints (``cleanup.streams.lineup``) are shown too: the poller reads them first, or, gone, reports them lost;
* the queues: depth (GetQueueAttributes) and oldest-message age, which SQS gives only as a CloudWatch metric
  (GetMetricStatistics ``ApproximateAgeOfOldestMessage``; "unknown" when CloudWatch has no datapoint);
* the last sweep, as CloudWatch saw it: the sweeper keeps no state of its own, but every sweep emits
  ``SessionsSwept``; its latest datapoint is the last sweep ("unknown" when there is none in ``SWEEP_LOOKBACK``).

Every failure of a read becomes an ``error`` in its part of the answer: a status is still worth showing half-known.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from cleanup.aws.calls import call
from cleanup.exceptions import CleanupError, StreamNotFoundError
from cleanup.runtime import Runtime
from cleanup.streams.checkpoint_table import table_call, table_exists
from cleanup.streams.checkpoints import Checkpoint, checkpoint_of
from cleanup.streams.lease import LEASE_SHARD
from cleanup.streams.lineup import unfinished_streams
from cleanup.streams.reader import ShardReader, list_shards
from cleanup.streams.record_age import describe, verdict
from cleanup.streams.shard_losses import GONE
from cleanup.streams.shard_state import shard_reader

LAG_PAGES = 3
SWEEP_LOOKBACK = timedelta(hours=3)
QUEUE_AGE_LOOKBACK = timedelta(minutes=15)


def mode(runtime: Runtime) -> dict[str, Any]:
    """CLEANUP_MODE, whether a kill switch is configured, and the mode in force with where it comes from."""
    switch = runtime.switch
    return {
        "environment": runtime.settings.cleanup_mode.value,
        "killSwitch": "configured" if switch.configured else "not configured",
        **switch.state().as_dict(),
    }


def earlier_streams(runtime: Runtime, latest: str) -> list[dict[str, Any]] | dict[str, Any]:
    """Each earlier stream of ``latest``'s table with unfinished checkpoints, as ``poller`` shows a stream (an error
    instead when the checkpoint table cannot be read)."""
    table = runtime.settings.checkpoint_table
    try:
        if not table_exists(runtime.clients.dynamodb, table):
            return []
        earlier = unfinished_streams(runtime.clients.dynamodb, table, latest)
    except CleanupError as exc:
        return {"table": table, "error": str(exc)}
    return [poller(runtime, arn) for arn in earlier]


def poller(runtime: Runtime, stream_arn: str) -> dict[str, Any]:
    """The lease and each shard's checkpoint and lag (read-only)."""
    table = runtime.settings.checkpoint_table
    items: dict[str, dict[str, Any]] = {}
    try:
        # No table: no poller has run (a Lambda deployment); the lag still says what one would find.
        exists = table_exists(runtime.clients.dynamodb, table)
        items = _checkpoint_items(runtime, table, stream_arn) if exists else {}
        shards = list_shards(runtime.clients.streams, stream_arn)
    except StreamNotFoundError:
        return _gone(stream_arn, table, items)
    except CleanupError as exc:
        return {"stream": stream_arn, "table": table, "error": str(exc)}
    lease = items.pop(LEASE_SHARD, None)
    return {
        "stream": stream_arn,
        "table": table if exists else None,
        "lease": _lease(lease),
        "shards": [_shard(runtime, stream_arn, shard.shard_id, items.get(shard.shard_id)) for shard in shards],
    }


def _gone(stream_arn: str, table: str, items: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A stream that no longer exists: its unfinished checkpoints are records lost (the next run reports them)."""
    items.pop(LEASE_SHARD, None)
    unfinished = {shard: checkpoint_of(item) for shard, item in items.items() if not checkpoint_of(item).finished}
    shards = [
        {"shardId": shard, "checkpoint": c.sequence_number, "lost": {"after": c.sequence_number, "why": GONE}}
        for shard, c in sorted(unfinished.items())
    ]
    return {
        "stream": stream_arn,
        "table": table,
        "gone": True,
        "lease": {"holder": None, "term": None},
        "shards": shards,
    }


def _checkpoint_items(runtime: Runtime, table: str, stream_arn: str) -> dict[str, dict[str, Any]]:
    dynamodb, items = runtime.clients.dynamodb, {}
    kwargs: dict[str, Any] = {
        "TableName": table,
        "KeyConditionExpression": "stream = :stream",
        "ExpressionAttributeValues": {":stream": {"S": stream_arn}},
    }
    while True:
        page = table_call(dynamodb.query, "Query", table, **kwargs)
        items.update({item["shard"]["S"]: item for item in page.get("Items", [])})
        if "LastEvaluatedKey" not in page:
            return items
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def _lease(item: dict[str, Any] | None) -> dict[str, Any]:
    if item is None or "owner" not in item:
        return {"holder": None, "term": None}
    heartbeat = item.get("heartbeatAt", {}).get("N")
    return {
        "holder": item["owner"]["S"] or None,  # released: empty
        "term": int(item["version"]["N"]) if "version" in item else None,
        "heartbeatAt": _iso(float(heartbeat)) if heartbeat else None,
    }


def _shard(runtime: Runtime, stream_arn: str, shard_id: str, item: dict[str, Any] | None) -> dict[str, Any]:
    saved = checkpoint_of(item) if item is not None else Checkpoint(None)
    line: dict[str, Any] = {"shardId": shard_id, "checkpoint": saved.sequence_number}
    if saved.finished:
        return {**line, "finished": True, "waiting": 0}
    # A LATEST start's pin is where the poller reads again from; the lag counts from there, as it does from a
    # checkpoint, or else from START_POSITION.
    if saved.at is not None:
        line["pinnedAt"] = saved.at
    if saved.since is not None:
        line["pinnedSince"] = _iso(saved.since)
    start = runtime.settings.start_position
    reader = shard_reader(
        runtime.clients.streams, stream_arn, shard_id, saved, start, runtime.settings, limit=1000, empty_reads_at_end=1
    )
    try:
        waiting, first = _waiting(reader)
    except CleanupError as exc:
        return {**line, "error": str(exc)}
    if reader.gap_after is not None:  # the checkpoint (or pin) is older than the stream's retention
        before = first.get("dynamodb", {}).get("SequenceNumber") if first else None
        line["lost"] = {"after": reader.gap_after, "before": before, "why": "trimmed before they were read"}
    line["waiting"] = waiting if waiting < LAG_PAGES * 1000 else f"{waiting}+"
    if first is not None:
        line["lagSeconds"] = round(time.time() - _created(first), 1)
        if verdict(line["lagSeconds"]) is not None:
            line["warning"] = describe(line["lagSeconds"])
    return line


def _waiting(reader: ShardReader) -> tuple[int, dict[str, Any] | None]:
    """How many records wait (at most LAG_PAGES pages), and the first of them."""
    waiting = 0
    first: dict[str, Any] | None = None
    for _ in range(LAG_PAGES):
        records = reader.read().records
        waiting += len(records)
        if first is None and records:
            first = records[0]
        if reader.ended or not records:
            break
    return waiting, first


def _created(record: dict[str, Any]) -> float:
    created = record.get("dynamodb", {}).get("ApproximateCreationDateTime")
    return created.timestamp() if isinstance(created, datetime) else float(created or time.time())


def queue(runtime: Runtime, url: str) -> dict[str, Any]:
    """A queue's depth (visible and in flight) and its oldest message's age, as far as CloudWatch knows it."""
    line: dict[str, Any] = {"url": url}
    try:
        answer = call(
            runtime.clients.sqs.get_queue_attributes,
            "GetQueueAttributes",
            None,
            QueueUrl=url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )
    except CleanupError as exc:
        return {**line, "error": str(exc)}
    attributes = answer.get("Attributes", {})
    line["messages"] = int(attributes.get("ApproximateNumberOfMessages", 0))
    line["inFlight"] = int(attributes.get("ApproximateNumberOfMessagesNotVisible", 0))
    name = url.rstrip("/").rsplit("/", 1)[-1]
    age = _latest(runtime, "AWS/SQS", "ApproximateAgeOfOldestMessage", {"QueueName": name}, QUEUE_AGE_LOOKBACK)
    line["oldestAgeSeconds"] = age[1] if age else "unknown"
    return line


def last_sweep(runtime: Runtime) -> dict[str, Any]:
    """When the last sweep ran and how many sessions it swept, from its ``SessionsSwept`` metric."""
    dimensions = {"Service": runtime.settings.service_name}
    namespace = runtime.settings.metrics_namespace
    try:
        latest = _latest(runtime, namespace, "SessionsSwept", dimensions, SWEEP_LOOKBACK, stat="Sum")
    except CleanupError as exc:
        return {"error": str(exc)}
    if latest is None:
        hours = SWEEP_LOOKBACK.total_seconds() / 3600
        return {"at": "unknown", "why": f"no SessionsSwept datapoint in the last {hours:.0f} h"}
    return {"at": latest[0], "swept": int(latest[1])}


def _latest(
    runtime: Runtime,
    namespace: str,
    metric: str,
    dimensions: dict[str, str],
    lookback: timedelta,
    stat: str = "Maximum",
) -> tuple[str, float] | None:
    """The latest datapoint (time, value) of a CloudWatch metric within ``lookback``, or None.

    Raises:
        TransientError / PermanentError: CloudWatch could not be read.
    """
    now = datetime.now(UTC)
    answer = call(
        runtime.clients.get("cloudwatch").get_metric_statistics,
        "GetMetricStatistics",
        None,
        Namespace=namespace,
        MetricName=metric,
        Dimensions=[{"Name": name, "Value": value} for name, value in dimensions.items()],
        StartTime=now - lookback,
        EndTime=now,
        Period=60,
        Statistics=[stat],
    )
    # A datapoint without its time or its statistic (a cut answer) says nothing: it is left out.
    points = [point for point in answer.get("Datapoints", []) if "Timestamp" in point and stat in point]
    points.sort(key=lambda point: point["Timestamp"])
    if not points:
        return None
    return points[-1]["Timestamp"].isoformat(), float(points[-1][stat])


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")
