"""A third-party action kind, written against the action API only: the other rows of an expired session's partition
whose sort key starts with ROWS_SORT_PREFIX, deleted with BatchWriteItem, behind the fence.

It is no part of the worker: the tests enable it by name (ACTIONS=...,rows) after registering it, as an entry point
of the ``session_cleanup.actions`` group would.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any

from cleanup.actions.api import ActionKind, Context, Gate, Holding, Step
from cleanup.aws.calls import call
from cleanup.deadline import Deadline
from cleanup.exceptions import NowHeldError, TransientError
from schemas.outcomes import ActionStatus
from schemas.session import Session

BATCH = 25  # BatchWriteItem's limit
TRIES = 5


class PartitionRows(ActionKind):
    """The rows beside the session's own in its partition, under a sort-key prefix."""

    name = "rows"
    reads = ("pk", "sk")
    paced_by = "dynamodb"

    def plan(self, session: Session, context: Context) -> Sequence[Step]:
        table, prefix = context.runtime.settings.session_table, os.environ.get("ROWS_SORT_PREFIX", "")
        if session.pk is None or not table or not prefix:
            return []
        gate = self.gate(context, session.pk)
        dynamodb, names = context.runtime.clients.dynamodb, context.runtime.settings.attributes  # reads only
        pk, own = session.pk, session.sk

        def run(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
            found = call(
                dynamodb.query,
                "Query",
                deadline,
                TableName=table,
                KeyConditionExpression="#pk = :pk AND begins_with(#sk, :prefix)",
                ExpressionAttributeNames={"#pk": names.pk, "#sk": names.sk},
                ExpressionAttributeValues={":pk": {"S": pk}, ":prefix": {"S": prefix}},
                ProjectionExpression="#pk, #sk",
                ConsistentRead=True,
            )
            if "Items" not in found:  # a garbled answer says nothing about what is there
                raise TransientError("Query: an answer without Items")
            keys = [item for item in found["Items"] if item.get(names.sk) != {"S": own}]
            deleted = 0
            try:
                for start in range(0, len(keys), BATCH):
                    self.delete(gate, table, keys[start : start + BATCH], deadline)
                    deleted += len(keys[start : start + BATCH])
            except NowHeldError as held:
                raise NowHeldError(str(held), deleted) from held
            return (ActionStatus.DONE if deleted else ActionStatus.ALREADY_DONE), {"rows": deleted}

        return [self.step(pk, {"table": table, "prefix": prefix}, run=run)]

    def delete(self, gate: Gate, table: str, keys: list[Any], deadline: Deadline) -> None:
        pending = [{"DeleteRequest": {"Key": key}} for key in keys]
        for _ in range(TRIES):
            answer = gate.aws(deadline, "dynamodb", "BatchWriteItem", RequestItems={table: pending})
            if "UnprocessedItems" not in answer:
                raise TransientError("BatchWriteItem: an answer without UnprocessedItems: cannot tell")
            pending = answer["UnprocessedItems"].get(table, [])
            if not pending:
                return
        raise TransientError(f"BatchWriteItem: {len(pending)} rows still unprocessed")

    def holding(self, resource: str, live: Session, location: Any) -> Holding:
        # An item under the deleted one's key: the session is back, and its partition's rows are its own again.
        return Holding.HELD if live.pk == resource else Holding.UNKNOWN


class Swallowing(PartitionRows):
    """The same kind, careless: it catches every exception around its gate (a permit's refusal too)."""

    name = "swallowing"

    def delete(self, gate: Gate, table: str, keys: list[Any], deadline: Deadline) -> None:
        with contextlib.suppress(Exception):  # the point: a kind that swallows the permit's refusal too
            super().delete(gate, table, keys, deadline)
