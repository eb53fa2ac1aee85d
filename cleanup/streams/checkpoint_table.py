"""The checkpoint table itself (CHECKPOINT_TABLE): creating it, and what its errors mean.

Throttling and server errors are transient: the consumer backs off and tries again. Anything else (above all a role
without the permission the call needs) is a ``CheckpointTableError`` that names the table and, for a denied call,
the IAM actions to grant: no consumer can run until someone fixes it, so it ends the command.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from cleanup.aws.answers import needed
from cleanup.aws.calls import call, call_or_gone
from cleanup.exceptions import AccessDeniedError, CheckpointTableError, CleanupError, TransientError
from cleanup.telemetry import log

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

P = ParamSpec("P")
R = TypeVar("R")

TABLE_ACTIVE_TIMEOUT_SECONDS = 120.0
EXPIRY_ATTRIBUTE = "expiresAt"
"""The table's TTL attribute: items that hold it (a failing record's first-try time) expire; checkpoints and the
lease have none and stay."""
IAM_ACTIONS: dict[str, tuple[str, ...]] = {
    "DescribeTable": ("dynamodb:DescribeTable",),
    "CreateTable": ("dynamodb:CreateTable",),
    "Query": ("dynamodb:Query",),
    "GetItem": ("dynamodb:GetItem",),
    "UpdateItem": ("dynamodb:UpdateItem",),
    "UpdateTimeToLive": ("dynamodb:UpdateTimeToLive",),
}
"""The IAM actions each call needs; a transaction needs those of its parts, given at its call."""


def table_error(error: CleanupError, table: str, operation: str, actions: Sequence[str] = ()) -> CleanupError:
    """What a failed call on the checkpoint table means (``actions``: what it needs, if not the default).

    Returns:
        ``error`` itself when transient (throttling, server and network errors); otherwise a CheckpointTableError
        naming the table and, for a denied call, the IAM actions to grant.
    """
    if isinstance(error, TransientError):
        return error
    if isinstance(error, AccessDeniedError):
        needed = " and ".join(actions or IAM_ACTIONS.get(operation, (f"dynamodb:{operation}",)))
        return CheckpointTableError(
            f"checkpoint table {table}: {operation} denied: the worker's role needs {needed} on table {table}"
        )
    return CheckpointTableError(f"checkpoint table {table}: {error}")


def table_call(method: Callable[P, R], operation: str, table: str, /, *args: P.args, **kwargs: P.kwargs) -> R:
    """One call on the checkpoint table, its failure translated by ``table_error``."""
    try:
        return call(method, operation, None, *args, **kwargs)
    except CleanupError as exc:
        raise table_error(exc, table, operation) from exc


def table_call_or_gone(
    method: Callable[P, R], operation: str, table: str, gone: Sequence[str], /, *args: P.args, **kwargs: P.kwargs
) -> R | None:
    """``table_call``, but None when the table answers with an error code in ``gone``."""
    try:
        return call_or_gone(method, operation, None, gone, *args, **kwargs)
    except CleanupError as exc:
        raise table_error(exc, table, operation) from exc


def ensure_table(dynamodb: DynamoDBClient, table: str, sleep: Callable[[float], None] = time.sleep) -> None:
    """Create the checkpoint table (on-demand) if it does not exist, and wait until it is ACTIVE.

    Raises:
        TransientError: throttling or a server error, or the table still not ACTIVE after two minutes.
        CheckpointTableError: anything else, e.g. a missing permission.
    """
    status = _status(dynamodb, table)
    created = status is None
    status = status or _create_table(dynamodb, table)
    waited = 0.0
    while status != "ACTIVE":
        if waited > TABLE_ACTIVE_TIMEOUT_SECONDS:
            raise TransientError(f"checkpoint table {table} still {status} after {waited:.0f} s")
        sleep(1.0)
        waited += 1.0
        status = _status(dynamodb, table) or "DELETED"
    if created:
        _enable_expiry(dynamodb, table)


def table_exists(dynamodb: DynamoDBClient, table: str) -> bool:
    """Whether the checkpoint table exists (raises as ``ensure_table``)."""
    return _status(dynamodb, table) is not None


def _status(dynamodb: DynamoDBClient, table: str) -> str | None:
    """The table's status, or None when it does not exist."""
    gone = ("ResourceNotFoundException",)
    answer = table_call_or_gone(dynamodb.describe_table, "DescribeTable", table, gone, TableName=table)
    return None if answer is None else str(needed(answer, "DescribeTable", "Table", "TableStatus", kind=str))


def _create_table(dynamodb: DynamoDBClient, table: str) -> str:
    log.info("creating the checkpoint table", extra={"table": table})
    created = table_call_or_gone(
        dynamodb.create_table,
        "CreateTable",
        table,
        ("ResourceInUseException",),  # another consumer created it first
        TableName=table,
        AttributeDefinitions=[
            {"AttributeName": "stream", "AttributeType": "S"},
            {"AttributeName": "shard", "AttributeType": "S"},
        ],
        KeySchema=[{"AttributeName": "stream", "KeyType": "HASH"}, {"AttributeName": "shard", "KeyType": "RANGE"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return "CREATING" if created is None else str(needed(created, "CreateTable", "TableDescription", "TableStatus"))


def _enable_expiry(dynamodb: DynamoDBClient, table: str) -> None:
    """Turn on the table's TTL (``EXPIRY_ATTRIBUTE``). Housekeeping only: a refusal is logged, and the worker goes on
    (expired items are never read as live: a first-try time past its expiry belongs to no deliverable record)."""
    try:
        table_call(
            dynamodb.update_time_to_live,
            "UpdateTimeToLive",
            table,
            TableName=table,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": EXPIRY_ATTRIBUTE},
        )
    except CleanupError as exc:
        log.warning("checkpoint table TTL not enabled; old first-try times will stay", extra={"error": str(exc)})
