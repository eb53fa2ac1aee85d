"""Preflight of ``http-close``: the gateway tells a closed connection apart, with exactly CLOSE_GONE_STATUSES.

The worker counts a close "already done" only on an answer the operator declared (CLOSE_GONE_STATUSES, 410 by
default): a wrong path in CLOSE_URL, or a front end that answers 404 to what it will not serve, would otherwise count
every close done while no socket is closed. So the check sends a close, as the worker would (the method, the
signature), for a connection id nobody has (``cleanup-worker-check-<random>``), and expects exactly such an answer.
Closing a connection that does not exist changes nothing.
"""

from __future__ import annotations

import http.client
import uuid
from typing import NamedTuple

from cleanup.actions.bounded_http import exchange
from cleanup.actions.http_close import LONGEST_SECONDS, CloseRequest, encoded, endpoint_problems, signed
from cleanup.exceptions import PermanentError
from schemas.settings import Settings

NAME = "http-close: a closed connection is answered with CLOSE_GONE_STATUSES"


class Probe(NamedTuple):
    """What the check found (the fields of a preflight ``CheckResult``)."""

    name: str
    passed: bool
    detail: str
    fix: str = ""
    unchecked: bool = False


def probe_close(close: Settings) -> Probe:
    """Send a close for a made-up connection id, and judge the answer."""
    problems = endpoint_problems(close)
    if problems:
        detail = "; ".join(f"{name}: {why}" for name, why in problems.items())
        return Probe(
            NAME, False, detail, "fix it: the worker refuses to start with ACTIONS naming http-close until then"
        )
    url = str(close.close_url).replace("{connectionId}", encoded(f"cleanup-worker-check-{uuid.uuid4().hex}"))
    request = CloseRequest(close.close_method, url, gone=close.close_gone_statuses)
    try:
        if close.close_sigv4_service is not None:
            request = signed(request, close.close_sigv4_service)
        answer = exchange(request.method, request.url, request.headers, LONGEST_SECONDS)
    except PermanentError as exc:
        return Probe(NAME, False, str(exc), "give the check AWS credentials and a region to sign with")
    except (OSError, http.client.HTTPException) as exc:
        return Probe(NAME, False, f"{url}: {type(exc).__name__}: {exc}", "check CLOSE_URL and the network", True)
    gone = ",".join(str(status) for status in sorted(close.close_gone_statuses))
    if answer.status in close.close_gone_statuses:
        return Probe(NAME, True, f"{close.close_method} {url} answered {answer.status}")
    found = f"{close.close_method} {url} answered {answer.status} for a connection nobody has, not {gone}"
    return Probe(NAME, False, found, _fix(answer.status, answer.location))


def _fix(status: int, location: str | None) -> str:
    if 300 <= status < 400:
        return f"redirects are never followed: set CLOSE_URL to where it points ({location or 'no Location'})"
    if 200 <= status < 300:
        return "the gateway answers a close of any id as done: make it answer a closed connection with 410"
    return (
        f"if the gateway answers {status} for a closed connection, set CLOSE_GONE_STATUSES={status}; if not (a 404 "
        "from a wrong path), fix CLOSE_URL: until then every close would be counted done"
    )
