"""Calling AWS: the worker's one wrapper around a boto3 client method.

``call(client.list_objects_v2, "ListObjectsV2", deadline, Bucket=...)`` binds ``deadline`` for the call's duration
(``cleanup.pacing`` bounds every HTTP attempt by it) and translates botocore's errors into the worker's
(``cleanup.aws_errors.translate``): transient, permanent, or out of time. Error codes the caller names as ``gone``
(a 410 GoneException on a closed socket, a grant not found) mean "already done": the call then returns None.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from cleanup.aws_errors import error_code, status_code, translate
from cleanup.pacing import deadline_var
from cleanup.retry import Deadline


def call(
    method: Callable[..., Any], what: str, deadline: Deadline | None, /, *, gone: Collection[str] = (), **kwargs: Any
) -> Any:
    """``method(**kwargs)`` within ``deadline`` (None: no deadline); None when it fails with a code in ``gone``.

    Raises:
        TransientError: throttling, a server error, a timeout, or no time left before the deadline.
        PermanentError: anything retrying cannot fix (access denied, a bad request, ...).
    """
    token = deadline_var.set(deadline)
    try:
        return method(**kwargs)
    except ClientError as exc:
        if gone and (error_code(exc) in gone or str(status_code(exc)) in gone):
            return None
        raise translate(exc, what) from exc
    except BotoCoreError as exc:
        raise translate(exc, what) from exc
    finally:
        deadline_var.reset(token)
