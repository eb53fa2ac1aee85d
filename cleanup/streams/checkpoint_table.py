"""The checkpoint table itself (CHECKPOINT_TABLE): creating it, and what its errors mean.

Throttling and server errors are transient: the consumer backs off and tries again. Anything else (above all a role
without the permission the call needs) is a ``CheckpointTableError`` that names the table and, for a denied call,
the IAM actions to grant: no consumer can run until someone fixes it, so it ends the command.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from cleanup.aws_errors import error_code, translate
from cleanup.exceptions import CheckpointTableError, CleanupError, TransientError
from cleanup.telemetry import log

TABLE_ACTIVE_TIMEOUT_SECONDS = 120.0
ACCESS_DENIED_CODES = frozenset({"AccessDeniedException", "AccessDenied"})
IAM_ACTIONS: dict[str, tuple[str, ...]] = {
    "DescribeTable": ("dynamodb:DescribeTable",),
    "CreateTable": ("dynamodb:CreateTable",),
    "Query": ("dynamodb:Query",),
    "GetItem": ("dynamodb:GetItem",),
    "UpdateItem": ("dynamodb:UpdateItem",),
}
"""The IAM actions each call needs; a transaction needs those of its parts, given at its call."""


def table_error(exc: Exception, table: str, operation: str, actions: Sequence[str] = ()) -> CleanupError:
    """The worker's error for a failed call on the checkpoint table (``actions``: what it needs, if not the default).

    Returns:
        TransientError for throttling, server and network errors; CheckpointTableError for anything else.
    """
    error = translate(exc, operation)
    if isinstance(error, TransientError):
        return error
    if isinstance(exc, ClientError) and error_code(exc) in ACCESS_DENIED_CODES:
        needed = " and ".join(actions or IAM_ACTIONS.get(operation, (f"dynamodb:{operation}",)))
        return CheckpointTableError(
            f"checkpoint table {table}: {operation} denied: the worker's role needs {needed} on table {table}"
        )
    return CheckpointTableError(f"checkpoint table {table}: {error}")


def ensure_table(dynamodb: Any, table: str, sleep: Callable[[float], None] = time.sleep) -> None:
    """Create the checkpoint table (on-demand) if it does not exist, and wait until it is ACTIVE.

    Raises:
        TransientError: throttling or a server error, or the table still not ACTIVE after two minutes.
        CheckpointTableError: anything else, e.g. a missing permission.
    """
    try:
        status = _status(dynamodb, table)
    except ClientError as exc:
        if error_code(exc) != "ResourceNotFoundException":
            raise table_error(exc, table, "DescribeTable") from exc
        status = _create_table(dynamodb, table)
    except BotoCoreError as exc:
        raise table_error(exc, table, "DescribeTable") from exc
    waited = 0.0
    while status != "ACTIVE":
        if waited > TABLE_ACTIVE_TIMEOUT_SECONDS:
            raise TransientError(f"checkpoint table {table} still {status} after {waited:.0f} s")
        sleep(1.0)
        waited += 1.0
        try:
            status = _status(dynamodb, table)
        except (ClientError, BotoCoreError) as exc:
            raise table_error(exc, table, "DescribeTable") from exc


def _status(dynamodb: Any, table: str) -> str:
    return str(dynamodb.describe_table(TableName=table)["Table"]["TableStatus"])


def _create_table(dynamodb: Any, table: str) -> str:
    log.info("creating the checkpoint table", extra={"table": table})
    try:
        created = dynamodb.create_table(
            TableName=table,
            AttributeDefinitions=[
                {"AttributeName": "stream", "AttributeType": "S"},
                {"AttributeName": "shard", "AttributeType": "S"},
            ],
            KeySchema=[{"AttributeName": "stream", "KeyType": "HASH"}, {"AttributeName": "shard", "KeyType": "RANGE"}],
            BillingMode="PAY_PER_REQUEST",
        )
    except ClientError as exc:
        if error_code(exc) == "ResourceInUseException":  # another consumer created it first
            return "CREATING"
        raise table_error(exc, table, "CreateTable") from exc
    except BotoCoreError as exc:
        raise table_error(exc, table, "CreateTable") from exc
    return str(created["TableDescription"]["TableStatus"])
