"""Close the session's WebSocket: API Gateway Management API DeleteConnection."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cleanup.aws.calls import call_or_gone
from cleanup.core.action_api import ActionKind, Context, Gate, Holding, Step
from cleanup.core.guard import callback_endpoint, execute_api_region
from cleanup.core.guard import connection_id as connection_id_of
from cleanup.deadline import Deadline
from cleanup.exceptions import PermanentError
from schemas.outcomes import ActionStatus
from schemas.session import Session

if TYPE_CHECKING:
    from mypy_boto3_apigatewaymanagementapi import ApiGatewayManagementApiClient

ACTION = "connection"
GONE = ("GoneException", "410")


def close_connection(
    management: ApiGatewayManagementApiClient,
    connection_id: str,
    deadline: Deadline | None = None,
    *,
    permit: Gate,
) -> ActionStatus:
    """Close ``connection_id``, with the permit of ``permit`` (its gate) asked where the call leaves
    (``cleanup.aws.permits``). A connection that is already gone (410 GoneException) counts as closed.

    Raises:
        NowHeldError: ``permit`` keeps the connection (a live session holds it).
        TransientError: throttling, 5xx or a network failure.
        PermanentError: forbidden, bad request, a host that does not resolve, and anything else.
    """
    deadline = deadline or Deadline()
    with permit.sending(deadline):
        closed = call_or_gone(
            management.delete_connection, "DeleteConnection", deadline, GONE, ConnectionId=connection_id
        )
    return ActionStatus.ALREADY_DONE if closed is None else ActionStatus.DONE


class Connection(ActionKind):
    """The session's socket (``ATTR_CONNECTION_ID``, at ``ATTR_CALLBACK_URL`` or WS_CALLBACK_URL)."""

    name = ACTION
    owns = ("connection_id", "callback_url")
    paced_by = "apigatewaymanagementapi"
    gone = frozenset(GONE)
    phase = 1
    together = True

    def plan(self, session: Session, context: Context) -> Sequence[Step]:
        if not session.connection_id:
            return []
        attribute, runtime = session.connection_id, context.runtime
        # The fence compares the live item's attribute with the old one (``attribute``); the call takes the id in it.
        try:
            ident = connection_id_of(attribute, runtime.settings)
            endpoint = callback_endpoint(session.callback_url, runtime.settings)
        except PermanentError as exc:
            return [self.step(attribute, {"connectionId": attribute}, refusal=exc)]
        region = execute_api_region(endpoint)  # an execute-api endpoint is signed for its own region
        gate = self.gate(context, attribute)

        def run(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
            management = runtime.clients.management(endpoint, region)
            return close_connection(management, ident, deadline, permit=gate), {}

        return [self.step(attribute, {"connectionId": ident, "endpoint": endpoint}, run=run)]

    def holding(self, resource: str, live: Session, location: Any) -> Holding:
        return Holding.HELD if live.connection_id == resource else Holding.FREE

    def covering(self, resource: str, location: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
        try:
            return (f"connection:{connection_id_of(resource, self.settings)}",), ()
        except PermanentError:
            return (), ()  # refused at planning: no call is made
