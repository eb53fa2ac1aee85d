"""Retire the session's KMS grant.

The grant must name the worker's role as its retiring principal (CreateGrant ``RetiringPrincipal``), and ``KeyId``
must be the key's ARN: RetireGrant does not accept a bare key id or an alias.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cleanup.aws.calls import call_or_gone
from cleanup.aws.retry import Deadline
from schemas.outcomes import ActionStatus

if TYPE_CHECKING:
    from mypy_boto3_kms import KMSClient

    from cleanup.fence import Permit

ACTION = "grant"


def retire_grant(
    kms: KMSClient, key_id: str, grant_id: str, deadline: Deadline | None = None, *, permit: Permit
) -> ActionStatus:
    """Retire ``grant_id`` on ``key_id``, once ``permit`` lets it (``cleanup.fence``). A grant that is not found
    (already retired or revoked) counts as retired.

    Raises:
        NowHeldError: ``permit`` keeps the grant (a live session holds it).
        TransientError: throttling, KMS internal errors, timeouts.
        PermanentError: access denied, invalid grant id, key disabled or pending deletion, and anything else.
    """
    permit(deadline or Deadline())
    retired = call_or_gone(
        kms.retire_grant, "RetireGrant", deadline, ("NotFoundException",), KeyId=key_id, GrantId=grant_id
    )
    return ActionStatus.ALREADY_DONE if retired is None else ActionStatus.DONE
