"""Close the session's WebSocket: API Gateway Management API DeleteConnection."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from cleanup.aws_errors import error_code, status_code, translate
from schemas.outcomes import ActionStatus

ACTION = "connection"


def close_connection(management: Any, connection_id: str) -> ActionStatus:
    """Close ``connection_id``. A connection that is already gone (410 GoneException) counts as closed.

    Raises:
        TransientError: throttling, 5xx or a network failure.
        PermanentError: forbidden, bad request and anything else.
    """
    try:
        management.delete_connection(ConnectionId=connection_id)
    except ClientError as exc:
        if error_code(exc) == "GoneException" or status_code(exc) == 410:
            return ActionStatus.ALREADY_DONE
        raise translate(exc, "DeleteConnection") from exc
    except BotoCoreError as exc:
        raise translate(exc, "DeleteConnection") from exc
    return ActionStatus.DONE
