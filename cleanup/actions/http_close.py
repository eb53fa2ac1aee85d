"""Close the session's socket on the application's own gateway: one HTTP call to CLOSE_URL.

For applications that run their own connection gateway instead of API Gateway's WebSocket API: enable it in place of
``connection`` (``ACTIONS=http-close,grant,scratch,registry``; both own the connection id, so they are never enabled
together). The call goes to CLOSE_URL with the connection id put in (percent-encoded), with CLOSE_METHOD, behind the
fence like every destructive call. Its host must be one of ALLOWED_CLOSE_HOSTS, and its scheme HTTPS (plain HTTP only
to a loopback address): the id comes from the item, the rest only from settings.

Answers: 2xx closed; 404 and 410 already gone; 429 and 5xx transient (and so are a timeout or a refused connection);
any other answer is permanent, with the first 200 bytes of its body.
"""

from __future__ import annotations

import ipaddress
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlsplit

import botocore.session
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest

from cleanup.actions.api import ActionKind, Context, Gate, Holding, Step
from cleanup.aws.pacing import CONNECT_TIMEOUT_SECONDS, MIN_READ_SECONDS
from cleanup.aws.permits import SendCheck
from cleanup.aws.retry import Deadline
from cleanup.core.guard import connection_id as connection_id_of
from cleanup.exceptions import OutOfTimeError, PermanentError, TransientError
from schemas.outcomes import ActionStatus
from schemas.session import Session
from schemas.settings import HttpCloseSettings, Settings

ACTION = "http-close"
GONE = ("404", "410")
LONGEST_SECONDS = 10.0  # one close call, at most


class HttpClose(ActionKind):
    """The session's socket on the application's own gateway (``ATTR_CONNECTION_ID``, closed at CLOSE_URL)."""

    name = ACTION
    owns = ("connection_id",)
    paced_by = "http"
    gone = frozenset(GONE)
    phase = 1
    together = True

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.close = HttpCloseSettings()

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
        method, service = self.close.close_method, self.close.close_sigv4_service

        def run(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
            return close_connection(gate, url, method, deadline, sign=service), {}

        return [self.step(attribute, {"connectionId": ident, "url": url}, run=run)]

    def holding(self, resource: str, live: Session, location: Any) -> Holding:
        return Holding.HELD if live.connection_id == resource else Holding.FREE

    def covering(self, resource: str, location: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return ((f"http:{location}",), ()) if isinstance(location, str) else ((), ())


def close_url(close: HttpCloseSettings, connection_id: str) -> str:
    """CLOSE_URL for ``connection_id``, once its scheme and host are checked against the settings.

    Raises:
        PermanentError: no CLOSE_URL, or a host or scheme it may not call.
    """
    if close.close_url is None:
        raise PermanentError("http-close: set CLOSE_URL to the gateway's close URL (with {connectionId})")
    url = close.close_url.replace("{connectionId}", quote(connection_id, safe=""))
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    allowed = {name.strip().lower() for name in close.allowed_close_hosts.split(",") if name.strip()}
    if host not in allowed:
        raise PermanentError(f"http-close: host {host!r} is not in ALLOWED_CLOSE_HOSTS: the connection is kept")
    if parts.scheme != "https" and not (parts.scheme == "http" and _loopback(host)):
        raise PermanentError(f"http-close: {parts.scheme!r} to {host!r}: only HTTPS (or HTTP to loopback) is called")
    return url


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def close_connection(gate: Gate, url: str, method: str, deadline: Deadline, *, sign: str | None = None) -> ActionStatus:
    """Send the close call through ``gate``: DONE, or ALREADY_DONE when the gateway says it is gone (404, 410).
    ``sign``: the service to sign it for with SigV4 (None: unsigned).

    Raises:
        NowHeldError: the permit keeps the connection.
        TransientError: 429, 5xx, a timeout or a connection refused; OutOfTimeError: no time left for the call.
        PermanentError: any other answer, with the first 200 bytes of its body.
    """
    timeout = min(deadline.remaining(), LONGEST_SECONDS)
    if timeout < CONNECT_TIMEOUT_SECONDS + MIN_READ_SECONDS:
        raise OutOfTimeError(f"http-close: no time left to call {url}")
    request = urllib.request.Request(url, method=method)
    if sign is not None:
        _sign(request, sign)
    with gate.sending(deadline):  # the permit is asked in the opener's last hook, right before the request leaves
        return _send(SendCheck(gate.max_age).opener(), request, timeout)


def _sign(request: urllib.request.Request, service: str) -> None:
    """Add SigV4 headers for ``service``, with the process's credentials and region.

    Raises:
        PermanentError: no credentials or no region to sign with.
    """
    session = botocore.session.get_session()
    credentials, region = session.get_credentials(), session.get_config_variable("region")
    if credentials is None or not region:
        raise PermanentError(
            f"http-close: CLOSE_SIGV4_SERVICE={service}, but no AWS credentials or region to sign with"
        )
    signed = AWSRequest(method=request.get_method(), url=request.full_url, data=b"")
    SigV4Auth(credentials, service, region).add_auth(signed)
    for name, value in signed.headers.items():
        request.add_header(name, value)


def _send(opener: urllib.request.OpenerDirector, request: urllib.request.Request, timeout: float) -> ActionStatus:
    try:
        with opener.open(request, timeout=timeout) as answer:
            answer.read(200)
            return ActionStatus.DONE
    except urllib.error.HTTPError as answer:
        status = answer.code
        body = answer.read(200).decode("utf-8", "replace")
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise TransientError(f"http-close: {request.full_url}: {exc}") from exc
    if str(status) in GONE:
        return ActionStatus.ALREADY_DONE
    if status == 429 or status >= 500:
        raise TransientError(f"http-close: {request.full_url} answered {status}: {body}")
    raise PermanentError(f"http-close: {request.full_url} answered {status}: {body}")
