"""Close the session's WebSocket: API Gateway Management API DeleteConnection."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cleanup.aws.calls import call_or_gone
from cleanup.aws.retry import Deadline
from schemas.outcomes import ActionStatus

if TYPE_CHECKING:
    from mypy_boto3_apigatewaymanagementapi import ApiGatewayManagementApiClient

    from cleanup.fence import Permit

ACTION = "connection"
GONE = ("GoneException", "410")


def close_connection(
    management: ApiGatewayManagementApiClient, connection_id: str, deadline: Deadline | None = None, *, permit: Permit
) -> ActionStatus:
    """Close ``connection_id``, once ``permit`` lets it (``cleanup.fence``). A connection that is already gone (410
    GoneException) counts as closed.

    Raises:
        NowHeldError: ``permit`` keeps the connection (a live session holds it).
        TransientError: throttling, 5xx or a network failure.
        PermanentError: forbidden, bad request, a host that does not resolve, and anything else.
    """
    permit(deadline or Deadline())
    closed = call_or_gone(management.delete_connection, "DeleteConnection", deadline, GONE, ConnectionId=connection_id)
    return ActionStatus.ALREADY_DONE if closed is None else ActionStatus.DONE
