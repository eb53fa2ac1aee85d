"""Close the session's socket on the application's own gateway: one HTTP call to CLOSE_URL.

For applications that run their own connection gateway instead of API Gateway's WebSocket API: enable it in place of
``connection`` (``ACTIONS=http-close,grant,scratch,registry``; both own the connection id, so they are never enabled
together). The call goes to CLOSE_URL with the connection id put in, with CLOSE_METHOD, behind the fence like every
destructive call, its permit asked once connected, right before the request is written (``cleanup.aws.permits``). Its
host must be one of ALLOWED_CLOSE_HOSTS, and its scheme HTTPS (plain HTTP only to a loopback address): checked when the
process starts, which refuses to start otherwise (a configuration error, not a permanent failure of every record). The
id comes from the item, the rest only from settings: an id that is empty, ``.`` or ``..``, or that CLOSE_ID_PATTERN does
not match whole, is never sent (front ends resolve dot segments before routing, and SigV4 signs the resolved path:
``DELETE /connections/..`` could close every socket); the id is percent-encoded, ``.`` included.

Answers: 2xx closed; CLOSE_GONE_STATUSES (410 by default) already closed; 429 and 5xx transient (and so are a timeout, a
refused connection and an answer that is not well-formed HTTP); a 3xx is never followed (it is a failure naming where it
points: following it would carry the signed headers to any host, and count a socket closed that is not); any other
answer is permanent, with the first 200 bytes of its body. Each call ends within LONGEST_SECONDS or the record's
deadline, whichever is first, however slowly the gateway answers (``cleanup.actions.bounded_http``).
"""

from __future__ import annotations

import http.client
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import botocore.session
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest

from cleanup.actions.bounded_http import Answer, exchange
from cleanup.aws.pacing import CONNECT_TIMEOUT_SECONDS, MIN_READ_SECONDS
from cleanup.aws.permits import SendCheck
from cleanup.core.action_api import ActionKind, Context, Gate, Holding, Step
from cleanup.core.guard import connection_id as connection_id_of
from cleanup.deadline import Deadline
from cleanup.exceptions import (
    ConfigurationError,
    OutOfTimeError,
    PermanentError,
    RefusedConnectionError,
    TransientError,
)
from schemas.outcomes import ActionStatus
from schemas.session import Session
from schemas.settings import Settings

ACTION = "http-close"
LONGEST_SECONDS = 10.0  # one close call, at most, all told


class HttpClose(ActionKind):
    """The session's socket on the application's own gateway (``ATTR_CONNECTION_ID``, closed at CLOSE_URL)."""

    name = ACTION
    owns = ("connection_id",)
    paced_by = "http"
    phase = 1
    together = True

    def __init__(self, settings: Settings) -> None:
        """Raises:
        ConfigurationError: CLOSE_URL is unset, or names a host or scheme the worker may not call.
        """
        super().__init__(settings)
        self.close = settings
        problems = endpoint_problems(self.close)
        if problems:
            raise ConfigurationError(problems)
        self.gone = frozenset(str(status) for status in settings.close_gone_statuses)  # type: ignore[misc]

    def plan(self, session: Session, context: Context) -> Sequence[Step]:
        if not session.connection_id:
            return []
        attribute = session.connection_id
        try:
            ident = connection_id_of(attribute, context.runtime.settings)
            url = close_url(self.close, ident)
        except PermanentError as exc:
            return [self.step(attribute, {"connectionId": attribute}, refusal=exc)]
        gate = self.gate(context, attribute, url)
        close = self.close

        def run(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
            return close_connection(gate, url, close, deadline), {}

        return [self.step(attribute, {"connectionId": ident, "url": url}, run=run)]

    def holding(self, resource: str, live: Session, location: Any) -> Holding:
        return Holding.HELD if live.connection_id == resource else Holding.FREE

    def covering(self, resource: str, location: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return ((f"http:{location}",), ()) if isinstance(location, str) else ((), ())


def endpoint_problems(close: Settings) -> dict[str, str]:
    """Why CLOSE_URL cannot be called (each setting at fault, and why); empty when it can."""
    if close.close_url is None:
        return {"CLOSE_URL": "not set, and ACTIONS enables http-close: set it to the gateway's close URL"}
    parts = urlsplit(close.close_url.replace("{connectionId}", "id"))
    host = (parts.hostname or "").lower()
    allowed = {name.lower() for name in close.allowed_close_hosts}
    if host not in allowed:
        return {"ALLOWED_CLOSE_HOSTS": f"CLOSE_URL's host {host!r} is not in it: add it, or fix CLOSE_URL"}
    if parts.scheme != "https" and not (parts.scheme == "http" and _loopback(host)):
        return {"CLOSE_URL": f"{parts.scheme!r} to {host!r}: only HTTPS (or HTTP to a loopback address) is called"}
    return {}


def close_url(close: Settings, connection_id: str) -> str:
    """CLOSE_URL for ``connection_id``, once the id is checked (the endpoint is checked at start).

    Raises:
        RefusedConnectionError: an empty, ``.`` or ``..`` id, or one CLOSE_ID_PATTERN does not match.
        PermanentError: no CLOSE_URL, or a host or scheme it may not call.
    """
    problems = endpoint_problems(close)
    if problems:
        raise PermanentError("http-close: " + "; ".join(f"{name}: {why}" for name, why in problems.items()))
    shown = connection_id if len(connection_id) <= 200 else f"{connection_id[:197]}..."
    if connection_id in ("", ".", "..") or not re.fullmatch(close.close_id_pattern, connection_id):
        raise RefusedConnectionError(
            f"http-close: connection id {shown!r} is not one CLOSE_ID_PATTERN {close.close_id_pattern!r} admits (nor "
            "may it be empty, '.' or '..'): nothing was sent; fix the item, or the pattern, then redrive this record"
        )
    return str(close.close_url).replace("{connectionId}", encoded(connection_id))


def encoded(connection_id: str) -> str:
    """``connection_id`` as one path segment: every reserved character percent-encoded, and ``.`` too, so that no
    front end can read a dot segment in it."""
    return quote(connection_id, safe="").replace(".", "%2E")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class CloseRequest:
    """A close call, ready to send: its method, URL and headers (the signature's, when it is signed)."""

    method: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    gone: frozenset[int] = frozenset({410})


def close_connection(gate: Gate, url: str, close: Settings, deadline: Deadline) -> ActionStatus:
    """Send the close call through ``gate``: DONE, or ALREADY_DONE when the gateway answers CLOSE_GONE_STATUSES.

    Raises:
        NowHeldError: the permit keeps the connection.
        TransientError: 429, 5xx, a timeout, a refused connection, a garbled answer; OutOfTimeError: no time left.
        PermanentError: a redirect (never followed), or any other answer, with the first 200 bytes of its body.
    """
    timeout = min(deadline.remaining(), LONGEST_SECONDS)
    if timeout < CONNECT_TIMEOUT_SECONDS + MIN_READ_SECONDS:
        raise OutOfTimeError(f"http-close: no time left to call {url}")
    request = CloseRequest(close.close_method, url, gone=close.close_gone_statuses)
    if close.close_sigv4_service is not None:
        request = signed(request, close.close_sigv4_service)
    with gate.sending(deadline):  # the permit is asked once connected, right before the request is written
        return _send(request, timeout, SendCheck(gate.max_age))


def signed(request: CloseRequest, service: str) -> CloseRequest:
    """``request`` with SigV4 headers for ``service``, with the process's credentials and region.

    Raises:
        PermanentError: no credentials or no region to sign with.
    """
    session = botocore.session.get_session()
    credentials, region = session.get_credentials(), session.get_config_variable("region")
    if credentials is None or not region:
        raise PermanentError(
            f"http-close: CLOSE_SIGV4_SERVICE={service}, but no AWS credentials or region to sign with"
        )
    signing = AWSRequest(method=request.method, url=request.url, data=b"")
    SigV4Auth(credentials, service, region).add_auth(signing)
    headers = {**request.headers, **{name: str(value) for name, value in signing.headers.items()}}
    return CloseRequest(request.method, request.url, headers, request.gone)


def _send(request: CloseRequest, timeout: float, check: SendCheck) -> ActionStatus:
    def permit() -> None:
        check.check(f"{request.method} (http)", (f"http:{request.url}",), None)

    try:
        answer = exchange(request.method, request.url, request.headers, timeout, before_send=permit)
    except (OSError, http.client.HTTPException) as exc:  # refused, timed out, garbled: the close may not have gone
        raise TransientError(f"http-close: {request.url}: {type(exc).__name__}: {exc}") from exc
    return judged(answer, request)


def judged(answer: Answer, request: CloseRequest) -> ActionStatus:
    """What ``answer`` says of the close.

    Raises:
        TransientError / PermanentError: as ``close_connection``.
    """
    status = answer.status
    if 200 <= status < 300:
        return ActionStatus.DONE
    if status in request.gone:
        return ActionStatus.ALREADY_DONE
    body = answer.body.decode("utf-8", "replace")
    if 300 <= status < 400:
        raise PermanentError(
            f"http-close: {request.url} answered {status}, a redirect to {answer.location or 'nowhere named'}: "
            "redirects are never followed; set CLOSE_URL to where the gateway closes connections"
        )
    if status == 429 or status >= 500:
        raise TransientError(f"http-close: {request.url} answered {status}: {body}")
    raise PermanentError(f"http-close: {request.url} answered {status}: {body}")
