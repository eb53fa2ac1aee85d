"""Calling AWS: the worker's one wrapper around a boto3 client method.

``call(client.list_objects_v2, "ListObjectsV2", deadline, Bucket=...)`` makes the call in a pacing scope
(``cleanup.aws.pacing`` bounds every HTTP attempt by ``deadline`` and gives back what the call holds however it ends)
and translates botocore's errors into the worker's
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
from cleanup.aws.pacing import paced
from cleanup.deadline import Deadline
from cleanup.exceptions import CleanupError, TransientError

P = ParamSpec("P")
R = TypeVar("R")


def call(method: Callable[P, R], what: str, deadline: Deadline | None, /, *args: P.args, **kwargs: P.kwargs) -> R:
    """``method(*args, **kwargs)`` within ``deadline`` (None: no deadline).

    Raises:
        TransientError: throttling, a server error, a timeout, no time left before the deadline, or an unexpected
            exception from inside botocore (its parser on a garbled answer, say), named with its type and message.
        PermanentError: anything retrying cannot fix (access denied, a bad request, ...).
    """
    try:
        with paced(deadline):
            return method(*args, **kwargs)
    except CleanupError:
        raise
    except (ClientError, BotoCoreError) as exc:
        raise translate(exc, what) from exc
    except Exception as exc:  # not ours and not botocore's answer: the call failed, not the record's data
        raise TransientError(f"{what}: {type(exc).__name__}: {exc}") from exc


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
