"""The streams of a table a consumer reads when it starts (``cleanup-worker run --table-name``), oldest first.

A table's stream is replaced when its view type changes or the table is re-created: the old stream keeps its records
24 hours more (disabled, every shard closed, still readable), then is gone. A consumer that stopped while it read the
old stream (a restart, a deployment, a crash, a node drained at the change) left unfinished checkpoints there, and its
REMOVEs wait to be cleaned. So, before the table's latest stream, every stream of the table with unfinished
checkpoints is read, oldest first, as the in-process follower does: one still readable to its end; one gone has its
unfinished checkpoints reported lost, once, and forgotten (``cleanup.streams.poller``). ListStreams cannot name a
stream that is gone; the checkpoint table can, so it is what is read: one Scan, for the items of the table's streams
that are not finished.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cleanup.streams.checkpoint_table import table_call
from cleanup.streams.lease import LEASE_SHARD

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

STREAM_SEPARATOR = "/stream/"


def table_streams_prefix(stream_arn: str) -> str:
    """What the ARN of every stream of the table that ``stream_arn`` belongs to starts with."""
    return stream_arn.rsplit(STREAM_SEPARATOR, 1)[0] + STREAM_SEPARATOR


def label(stream_arn: str) -> str:
    """A stream's label (its creation time, ISO 8601): labels sort as the streams were made."""
    return stream_arn.rsplit(STREAM_SEPARATOR, 1)[-1]


def unfinished_streams(dynamodb: DynamoDBClient, table: str, latest: str) -> dict[str, list[str]]:
    """Every other stream of ``latest``'s table with unfinished checkpoints, oldest first: ARN -> its unfinished shards.

    Raises:
        TransientError: throttling or a server error.
        CheckpointTableError: anything else, e.g. a missing permission (``dynamodb:Scan``).
    """
    found: dict[str, list[str]] = {}
    kwargs: dict[str, Any] = {
        "TableName": table,
        "FilterExpression": "begins_with(#s, :table) AND #k <> :lease AND (attribute_not_exists(#f) OR #f = :no)",
        "ProjectionExpression": "#s, #k",
        "ExpressionAttributeNames": {"#s": "stream", "#k": "shard", "#f": "finished"},
        "ExpressionAttributeValues": {
            ":table": {"S": table_streams_prefix(latest)},
            ":lease": {"S": LEASE_SHARD},
            ":no": {"BOOL": False},
        },
        "ConsistentRead": True,
    }
    while True:
        page = table_call(dynamodb.scan, "Scan", table, **kwargs)
        for item in page.get("Items", []):
            found.setdefault(item["stream"]["S"], []).append(item["shard"]["S"])
        if "LastEvaluatedKey" not in page:
            break
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    found.pop(latest, None)
    return {arn: sorted(found[arn]) for arn in sorted(found, key=label)}
