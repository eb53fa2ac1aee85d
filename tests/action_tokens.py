"""Kinds the worker does not ship, written against the action API only, for the tests of the one rule.

``Tokens`` is a well-behaved kind whose resource is named by an attribute of its own (``tokenId``): the item
``token#<tokenId>`` of SESSION_TABLE, deleted with DeleteItem through its gate. The others misbehave, each in one way,
and the worker must keep its promise all the same: one frees with the reading taken when it was launched, after a
while; one raises an exception that is not the worker's; one hangs; one frees with a client of its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import boto3

from cleanup.actions.api import ActionKind, Context, Gate, Holding, Step
from cleanup.deadline import Deadline
from cleanup.exceptions import TransientError
from schemas.outcomes import ActionStatus
from schemas.session import Session


def token_key(token: str) -> dict[str, Any]:
    return {"pk": {"S": f"token#{token}"}, "sk": {"S": "token"}}


class Tokens(ActionKind):
    """A session's API token, an item of its own in SESSION_TABLE."""

    name = "tokens"
    attributes = ("tokenId",)
    frees = ("dynamodb.DeleteItem",)
    paced_by = "dynamodb"

    def plan(self, session: Session, context: Context) -> Sequence[Step]:
        token, table = session.value("tokenId"), context.runtime.settings.session_table
        if not isinstance(token, str) or not table:
            return []
        gate = self.gate(context, token)

        def run(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
            self.before_freeing(context, deadline)
            return self.free(gate, table, token, deadline), {}

        return [self.step(token, {"tokenId": token}, run=run)]

    def before_freeing(self, context: Context, deadline: Deadline) -> None:
        """What a kind does between its launch and its freeing call (nothing, for a well-behaved one)."""

    def free(self, gate: Gate, table: str, token: str, deadline: Deadline) -> ActionStatus:
        answer = gate.aws(
            deadline,
            "dynamodb",
            "DeleteItem",
            gone=("ConditionalCheckFailedException",),  # no such item: already gone
            TableName=table,
            Key=token_key(token),
            ConditionExpression="attribute_exists(pk)",
            ReturnValues="ALL_OLD",
        )
        if answer is None:
            return ActionStatus.ALREADY_DONE
        if not answer.get("Attributes"):  # a deletion answers what it deleted: a cut answer cannot tell
            raise TransientError("DeleteItem: an answer without the item it deleted: cannot tell")
        return ActionStatus.DONE

    def holding(self, resource: str, live: Session, location: Any) -> Holding:
        return Holding.HELD if live.value("tokenId") == resource else Holding.FREE


class LateTokens(Tokens):
    """Freed with the socket, on one read, but only after a while: its call must read again by then."""

    name = "late-tokens"
    phase = 1
    together = True
    back = threading.Event()
    """Set by the test once the session is back; the kind then waits out a reading's freshness."""

    def before_freeing(self, context: Context, deadline: Deadline) -> None:
        self.back.wait(timeout=30)
        time.sleep(context.runtime.settings.fence_read_max_age_seconds * 2)


class Raising(ActionKind):
    """A kind whose own client fails with an exception of its own, as a Redis client's ``ConnectionError``."""

    name = "raising"
    paced_by = "elasticache"
    phase = 0

    def plan(self, session: Session, context: Context) -> Sequence[Step]:
        def run(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
            raise ConnectionError("Error 111 connecting to redis:6379. Connection refused.")

        return [self.step(session.pk or "", {}, run=run)]

    def holding(self, resource: str, live: Session, location: Any) -> Holding:
        return Holding.FREE


class Hanging(Tokens):
    """Waits for ever (until the test lets it go), then tries its freeing call anyway."""

    name = "hanging"
    release = threading.Event()
    finished = threading.Event()
    tried: ClassVar[list[BaseException | None]] = []

    def free(self, gate: Gate, table: str, token: str, deadline: Deadline) -> ActionStatus:
        self.release.wait(timeout=60)
        try:
            status = super().free(gate, table, token, deadline)
            self.tried.append(None)
            return status
        except BaseException as exc:
            self.tried.append(exc)
            raise
        finally:
            self.finished.set()


class OwnClient(Tokens):
    """Frees with a client of its own, going around its gate."""

    name = "own-client"

    def free(self, gate: Gate, table: str, token: str, deadline: Deadline) -> ActionStatus:
        boto3.client("dynamodb").delete_item(TableName=table, Key=token_key(token))
        return ActionStatus.DONE


class RuntimeClient(Tokens):
    """Frees with the client it was given to read with."""

    name = "runtime-client"

    def plan(self, session: Session, context: Context) -> Sequence[Step]:
        self.dynamodb = context.runtime.clients.dynamodb
        return super().plan(session, context)

    def free(self, gate: Gate, table: str, token: str, deadline: Deadline) -> ActionStatus:
        self.dynamodb.delete_item(TableName=table, Key=token_key(token))
        return ActionStatus.DONE
