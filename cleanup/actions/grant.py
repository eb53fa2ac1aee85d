"""Retire the session's KMS grant.

The grant must name the worker's role as its retiring principal (CreateGrant ``RetiringPrincipal``), and ``KeyId``
must be the key's ARN: RetireGrant does not accept a bare key id or an alias.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from cleanup.aws_errors import error_code, translate
from schemas.outcomes import ActionStatus

ACTION = "grant"


def retire_grant(kms: Any, key_id: str, grant_id: str) -> ActionStatus:
    """Retire ``grant_id`` on ``key_id``. A grant that is not found (already retired or revoked) counts as retired.

    Raises:
        TransientError: throttling, KMS internal errors, timeouts.
        PermanentError: access denied, invalid grant id, key disabled or pending deletion, and anything else.
    """
    try:
        kms.retire_grant(KeyId=key_id, GrantId=grant_id)
    except ClientError as exc:
        if error_code(exc) == "NotFoundException":
            return ActionStatus.ALREADY_DONE
        raise translate(exc, "RetireGrant") from exc
    except BotoCoreError as exc:
        raise translate(exc, "RetireGrant") from exc
    return ActionStatus.DONE
