"""Translation of botocore failures into the worker's meanings, used at each call site."""

from __future__ import annotations

import socket

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    ReadTimeoutError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from cleanup.exceptions import (
    AccessDeniedError,
    CleanupError,
    ConditionFailedError,
    IteratorExpiredError,
    PermanentError,
    ThrottledError,
    TransientError,
    TrimmedDataError,
)

THROTTLING_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "TooManyRequestsException",
        "LimitExceededException",
        "RequestLimitExceeded",
        "SlowDown",
        "ProvisionedThroughputExceededException",
        "RequestThrottled",
        "RequestThrottledException",
        "BandwidthLimitExceeded",
        "TransactionInProgressException",
        "PriorRequestNotComplete",
        "EC2ThrottledException",
    }
)
# getaddrinfo's "no such host" answers (EAI_AGAIN, a resolver that could not answer, stays transient).
_NO_SUCH_HOST = frozenset(
    code for code in (getattr(socket, "EAI_NONAME", None), getattr(socket, "EAI_NODATA", None)) if code
)

TRANSIENT_CODES = THROTTLING_CODES | frozenset(
    {
        "InternalError",
        "InternalFailure",
        "InternalServerError",
        "InternalServerException",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "KMSInternalException",
        "DependencyTimeoutException",
        "RequestTimeout",
        "RequestTimeoutException",
    }
)


# DynamoDB Streams' two positions that cannot be read (any more): each has its own remedy.
STREAM_CODES: dict[str, type[TransientError]] = {
    "ExpiredIteratorException": IteratorExpiredError,  # open a new iterator where reading stopped
    "TrimmedDataAccessException": TrimmedDataError,  # past the 24 h retention: start over, reporting the gap
}


ACCESS_DENIED_CODES = frozenset({"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"})


def _condition_failed(exc: ClientError) -> bool:
    """A conditional write that failed its condition, alone or inside a transaction."""
    if error_code(exc) == "ConditionalCheckFailedException":
        return True
    reasons = exc.response.get("CancellationReasons") or []
    return error_code(exc) == "TransactionCanceledException" and any(
        reason.get("Code") == "ConditionalCheckFailed" for reason in reasons
    )


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def status_code(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def is_transient_code(code: str, status: int = 0) -> bool:
    return code in TRANSIENT_CODES or status == 429 or status >= 500


def translate(exc: Exception, what: str) -> CleanupError:
    """The worker's error for a failed AWS call: transient (throttling, 5xx, network) or permanent (the rest)."""
    if isinstance(exc, ClientError):
        code, status = error_code(exc), status_code(exc)
        message = f"{what}: {code or status} {exc.response.get('Error', {}).get('Message', '')}".rstrip()
        if code in STREAM_CODES:
            return STREAM_CODES[code](message)
        if code in ACCESS_DENIED_CODES:
            return AccessDeniedError(message)
        if _condition_failed(exc):
            return ConditionFailedError(message, exc.response.get("Item"))
        if code in THROTTLING_CODES:
            return ThrottledError(message)
        if is_transient_code(code, status):
            return TransientError(message)
        return PermanentError(message)
    if unresolvable_host(exc):
        return PermanentError(f"{what}: the endpoint's host name does not resolve: {exc}")
    if isinstance(exc, ReadTimeoutError | BotoConnectionError | HTTPClientError):
        return TransientError(f"{what}: {type(exc).__name__}: {exc}")
    if isinstance(exc, BotoCoreError):
        return PermanentError(f"{what}: {type(exc).__name__}: {exc}")
    return PermanentError(f"{what}: {type(exc).__name__}: {exc}")


def unresolvable_host(exc: BaseException) -> bool:
    """Whether a connection failed because DNS says the host does not exist (a temporary DNS failure is not that).

    botocore wraps urllib3's error, which wraps the resolver's ``socket.gaierror``: the chain is walked to find it.
    """
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, socket.gaierror):
            return current.errno in _NO_SUCH_HOST
        error = getattr(current, "kwargs", {}).get("error")
        pending += [error if isinstance(error, BaseException) else None, current.__cause__, current.__context__]
    return False
