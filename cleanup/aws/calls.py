"""Calling AWS: the worker's one wrapper around a boto3 client method.

``call(client.list_objects_v2, "ListObjectsV2", deadline, Bucket=...)`` binds ``deadline`` for the call's duration
(``cleanup.aws.pacing`` bounds every HTTP attempt by it) and translates botocore's errors into the worker's
(``cleanup.aws.aws_errors.translate``): transient, permanent, or out of time. ``call_or_gone`` also takes the error
codes that mean "already done" (a 410 GoneException on a closed socket, a grant not found): it then returns None.

Both are typed by the method they wrap: with the ``mypy_boto3_*`` stubs (clients are typed in ``cleanup.aws.clients``),
mypy checks the keywords and the answer's shape as if the method were called directly.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import ParamSpec, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from cleanup.aws.aws_errors import error_code, status_code, translate
from cleanup.aws.pacing import deadline_var
from cleanup.aws.retry import Deadline
from cleanup.exceptions import CleanupError

P = ParamSpec("P")
R = TypeVar("R")


def call(method: Callable[P, R], what: str, deadline: Deadline | None, /, *args: P.args, **kwargs: P.kwargs) -> R:
    """``method(*args, **kwargs)`` within ``deadline`` (None: no deadline).

    Raises:
        TransientError: throttling, a server error, a timeout, or no time left before the deadline.
        PermanentError: anything retrying cannot fix (access denied, a bad request, ...).
    """
    token = deadline_var.set(deadline)
    try:
        return method(*args, **kwargs)
    except (ClientError, BotoCoreError) as exc:
        raise translate(exc, what) from exc
    finally:
        deadline_var.reset(token)


def call_or_gone(
    method: Callable[P, R],
    what: str,
    deadline: Deadline | None,
    gone: Collection[str],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> R | None:
    """``call``, but None when AWS answers with an error code (or an HTTP status, as text) in ``gone``."""
    try:
        return call(method, what, deadline, *args, **kwargs)
    except CleanupError as exc:
        answer = exc.__cause__
        if isinstance(answer, ClientError) and (error_code(answer) in gone or str(status_code(answer)) in gone):
            return None
        raise
