"""What happened to each record: the one answer every entry point turns into its own."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Reason(StrEnum):
    """Why the session item was deleted."""

    TTL = "ttl"  # DynamoDB's TTL process (userIdentity Service / dynamodb.amazonaws.com)
    EXPIRED = "expired"  # ttl already passed when deleted: the sweeper, or a TTL delete replicated by a global table
    EXPLICIT = "explicit"  # logout, admin purge


class Status(StrEnum):
    CLEANED = "cleaned"
    PLANNED = "planned"  # a dry run: the session would have been cleaned; nothing was changed
    SKIPPED = "skipped"
    FAILED = "failed"
    DEFERRED = "deferred"  # what is left (waiting for a quota) went to the backlog queue: handled, not failed


class ActionStatus(StrEnum):
    DONE = "done"  # the call changed something
    ALREADY_DONE = "already-done"  # gone already (410, grant not found, empty prefix)
    KEPT = "kept"  # the live item still holds it (reconnect race)
    NOTHING = "nothing"  # the session had no such resource
    PLANNED = "planned"  # dry-run: would have been done
    FAILED = "failed"


class ActionResult(BaseModel):
    """One action's result on one record."""

    model_config = ConfigDict(frozen=True)

    action: str
    status: ActionStatus
    detail: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    permanent: bool = False

    @property
    def ok(self) -> bool:
        return self.status is not ActionStatus.FAILED


class Outcome(BaseModel):
    """One record's outcome. ``failed`` outcomes carry ``error`` and whether retrying could help."""

    model_config = ConfigDict(frozen=True)

    sequence_number: str
    """The record's id (``schemas.records.record_id``): outcomes are matched to records by it."""
    status: Status
    event_id: str | None = None
    event_name: str | None = None
    key: str | None = None
    reason: Reason | None = None
    skip_reason: str | None = None
    tenant_id: str | None = None
    ttl_lag_seconds: float | None = None
    actions: tuple[ActionResult, ...] = ()
    error: str | None = None
    permanent: bool = False
    dead_lettered: bool = False

    @property
    def failed(self) -> bool:
        return self.status is Status.FAILED

    def summary(self) -> dict[str, Any]:
        """The fields of the per-record log line (no grant tokens, no object keys)."""
        line: dict[str, Any] = {
            "sequenceNumber": self.sequence_number,
            "eventID": self.event_id,
            "status": self.status.value,
            "key": self.key,
        }
        optional = {
            "reason": self.reason.value if self.reason else None,
            "skipReason": self.skip_reason,
            "tenantId": self.tenant_id,
            "ttlLagSeconds": self.ttl_lag_seconds,
            "error": self.error,
            "permanent": self.permanent if self.failed else None,
            "deadLettered": self.dead_lettered or None,
        }
        line.update({name: value for name, value in optional.items() if value is not None})
        if self.actions:
            line["actions"] = {a.action: _action_line(a) for a in self.actions}
        return line


def _action_line(result: ActionResult) -> dict[str, Any]:
    line: dict[str, Any] = {"status": result.status.value, **result.detail}
    if result.error:
        line["error"] = result.error
    return line
