"""``http-close``: a session's socket on the application's own gateway is closed by one HTTP call, behind the fence,
against a real local gateway that tracks its open connections."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import botocore.session
import pytest

from cleanup.exceptions import ConfigurationError
from cleanup.queues.reporting import run_batch
from schemas.outcomes import ActionResult, ActionStatus, Outcome
from schemas.records import read_lambda_event
from tests.stack import SessionStack
from tests.test_connection_pattern import CONNECTION_TABLE, connection_row, end
from worker.local.gateway import LocalGateway

ACTIONS = "http-close,grant,scratch,registry"


@pytest.fixture
def own_gateway(gateway: LocalGateway, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalGateway]:
    """``http-close`` enabled in place of ``connection``, closing at the gateway's own URL."""
    monkeypatch.setenv("ACTIONS", ACTIONS)
    monkeypatch.setenv("CLOSE_URL", f"{gateway.callback_url}/@connections/{{connectionId}}")
    monkeypatch.setenv("ALLOWED_CLOSE_HOSTS", "127.0.0.1")
    yield gateway
    with gateway._lock:  # the gateway serves the whole run: no fault is left for the next test
        gateway._faults.clear()


def clean(stack: SessionStack) -> Outcome:
    outcomes = run_batch(read_lambda_event(stack.lambda_event()), stack.runtime())
    [outcome] = [o for o in outcomes if o.event_name == "REMOVE"]
    return outcome


def closing(outcome: Outcome) -> ActionResult:
    [result] = [a for a in outcome.actions if a.action == "http-close"]
    return result


def test_the_socket_is_closed_on_the_applications_gateway(stack: SessionStack, own_gateway: LocalGateway) -> None:
    client = own_gateway.connect()
    stack.put_session("h1", connection_id=client.connection_id)
    stack.delete("h1")

    outcome = clean(stack)

    assert closing(outcome).status is ActionStatus.DONE
    assert own_gateway.wait_gone(client.connection_id) and not own_gateway.is_open(client.connection_id)
    assert {a.action for a in outcome.actions} == {"http-close", "grant", "scratch"}


def test_a_socket_already_gone_is_done(stack: SessionStack, own_gateway: LocalGateway) -> None:
    stack.put_session("h2", connection_id="conn-never-open")
    stack.delete("h2")

    assert closing(clean(stack)).status is ActionStatus.ALREADY_DONE  # the gateway answered 410


def test_a_live_session_keeps_its_socket(stack: SessionStack, own_gateway: LocalGateway) -> None:
    client = own_gateway.connect()
    session = stack.put_session("h3", connection_id=client.connection_id)
    stack.delete("h3")
    stack.put_item(session)

    assert closing(clean(stack)).status is ActionStatus.KEPT
    assert own_gateway.is_open(client.connection_id)
    client.close()


@pytest.mark.parametrize(("status", "permanent"), [(503, False), (429, False), (403, True)])
def test_answers_are_transient_or_permanent(
    stack: SessionStack, own_gateway: LocalGateway, status: int, permanent: bool
) -> None:
    client = own_gateway.connect()
    stack.put_session(f"h{status}", connection_id=client.connection_id)
    stack.delete(f"h{status}")
    own_gateway.fail_next(5, status=status, message="the gateway says no")

    result = closing(clean(stack))

    assert result.status is ActionStatus.FAILED and result.permanent is permanent
    assert str(status) in (result.error or "")
    assert own_gateway.is_open(client.connection_id)
    if permanent:
        assert "the gateway says no" in (result.error or "")  # the answer's first bytes
    client.close()


@pytest.mark.parametrize(
    ("variables", "refused"),
    [
        ({"ALLOWED_CLOSE_HOSTS": "gateway.example.com"}, "ALLOWED_CLOSE_HOSTS: CLOSE_URL's host '127.0.0.1'"),
        (
            {
                "CLOSE_URL": "http://gateway.example.com/@connections/{connectionId}",
                "ALLOWED_CLOSE_HOSTS": "gateway.example.com",
            },
            "CLOSE_URL: 'http' to 'gateway.example.com': only HTTPS",
        ),
        ({"CLOSE_URL": None}, "CLOSE_URL: not set, and ACTIONS enables http-close"),
    ],
)
def test_a_close_url_the_worker_may_not_call_refuses_the_start_not_every_record(
    stack: SessionStack,
    own_gateway: LocalGateway,
    monkeypatch: pytest.MonkeyPatch,
    variables: dict[str, str | None],
    refused: str,
) -> None:
    for name, value in variables.items():
        if value is None:
            monkeypatch.delenv(name)
        else:
            monkeypatch.setenv(name, value)
    client = own_gateway.connect()
    stack.put_session("h4", connection_id=client.connection_id)
    stack.delete("h4")

    with pytest.raises(ConfigurationError, match=re.escape(refused)):  # nothing runs, nothing is dead-lettered
        stack.runtime()
    assert own_gateway.is_open(client.connection_id)
    client.close()


def test_http_close_and_connection_are_never_enabled_together(
    stack: SessionStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACTIONS", "connection,http-close")

    with pytest.raises(ConfigurationError, match="action 'http-close': owns 'connection_id', already owned by"):
        stack.runtime()


class Recorder(BaseHTTPRequestHandler):
    """Answers 204 to any close call and keeps its headers."""

    seen: ClassVar[list[dict[str, str]]] = []

    def do_DELETE(self) -> None:
        Recorder.seen.append(dict(self.headers))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return


def test_the_close_call_is_signed_for_the_service_it_names(
    stack: SessionStack, own_gateway: LocalGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("CLOSE_URL", f"http://127.0.0.1:{server.server_port}/@connections/{{connectionId}}")
        monkeypatch.setenv("CLOSE_SIGV4_SERVICE", "execute-api")
        stack.put_session("h6", connection_id="conn-h6")
        stack.delete("h6")

        assert closing(clean(stack)).status is ActionStatus.DONE
    finally:
        server.shutdown()
        server.server_close()
    [headers] = Recorder.seen
    assert headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=")
    region = botocore.session.get_session().get_config_variable("region")
    assert f"/{region}/execute-api/aws4_request" in headers["Authorization"]  # the worker's own region


def test_a_connection_table_row_closes_its_socket_on_the_own_gateway_and_frees_the_rest(
    stack: SessionStack, own_gateway: LocalGateway
) -> None:
    """The design whose gateway writes one row per connection: ``pk = conn#<id>``, ``sk = metadata``, TTL on
    ``expires_at``; the id inside the key is what the gateway's close URL names, and the live neighbour keeps all."""
    ended, live = own_gateway.connect(), own_gateway.connect()
    grant_id = connection_row(stack, f"conn#{ended.connection_id}", "sessions/t1/a/")
    live_grant = connection_row(stack, f"conn#{live.connection_id}", "sessions/t1/b/")
    end(stack, f"conn#{ended.connection_id}")

    outcomes = run_batch(read_lambda_event(stack.lambda_event()), stack.runtime(**CONNECTION_TABLE))
    [outcome] = [o for o in outcomes if o.event_name == "REMOVE"]

    assert closing(outcome).status is ActionStatus.DONE, outcome
    assert own_gateway.wait_gone(ended.connection_id) and own_gateway.is_open(live.connection_id)
    assert grant_id not in stack.grant_ids() and live_grant in stack.grant_ids()
    assert stack.objects("sessions/t1/a/") == [] and len(stack.objects("sessions/t1/b/")) == 3
