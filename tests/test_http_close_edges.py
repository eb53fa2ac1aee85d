"""``http-close`` at its edges, against an endpoint that answers as scripted: ids that are dot segments are never sent,
redirects are never followed, "gone" is only what the operator declared (and ``check`` tries it), a call ends by its
deadline however slowly the gateway answers, and a garbled answer is a retry."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cleanup.deadline import Deadline
from cleanup.queues.reporting import run_batch
from schemas.outcomes import ActionResult, ActionStatus
from schemas.records import read_lambda_event
from tests import close_endpoint
from tests.close_endpoint import Endpoint
from tests.stack import SessionStack
from tests.waiting import wait_for
from worker import cli


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[Endpoint]:
    """``http-close`` enabled, closing at a scripted endpoint on loopback."""
    with close_endpoint.running() as running:
        monkeypatch.setenv("ACTIONS", "http-close,grant,scratch,registry")
        monkeypatch.setenv("CLOSE_URL", running.url())
        monkeypatch.setenv("ALLOWED_CLOSE_HOSTS", "127.0.0.1")
        yield running


def closed(stack: SessionStack, connection_id: str, deadline: Deadline | None = None) -> ActionResult:
    """End a session holding ``connection_id`` and clean it; the http-close action's result."""
    stack.put_session("edge", connection_id=connection_id)
    stack.delete("edge")
    outcomes = run_batch(read_lambda_event(stack.lambda_event()), stack.runtime(), deadline)
    [result] = [a for o in outcomes if o.event_name == "REMOVE" for a in o.actions if a.action == "http-close"]
    return result


@pytest.mark.parametrize("connection_id", [".", "..", "conn 1", "conn?all=1", "x" * 257])
def test_a_dot_segment_or_an_id_of_no_expected_shape_is_never_sent(
    stack: SessionStack, endpoint: Endpoint, connection_id: str
) -> None:
    result = closed(stack, connection_id)

    assert result.status is ActionStatus.FAILED and result.permanent
    assert "CLOSE_ID_PATTERN" in (result.error or "") and endpoint.requests == []


def test_dots_inside_an_id_are_percent_encoded(stack: SessionStack, endpoint: Endpoint) -> None:
    assert closed(stack, "a.b..c").status is ActionStatus.ALREADY_DONE

    assert [(method, target) for method, target, _ in endpoint.requests] == [("DELETE", "/@connections/a%2Eb%2E%2Ec")]


@pytest.mark.parametrize("method", ["DELETE", "POST", "PUT", "GET"])
def test_a_redirect_is_never_followed_and_fails_naming_where_it_points(
    stack: SessionStack, endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    with close_endpoint.running() as elsewhere:
        monkeypatch.setenv("CLOSE_METHOD", method)
        endpoint.answer = close_endpoint.status(302, {"Location": elsewhere.url("/closed")})

        result = closed(stack, "conn-redirected")

        assert result.status is ActionStatus.FAILED and result.permanent
        assert "redirect" in (result.error or "") and elsewhere.url("/closed") in (result.error or "")
        assert elsewhere.requests == []  # nothing sent where it pointed, least of all the signed headers


@pytest.mark.parametrize(
    ("gone", "answered", "expected"), [("410", 404, None), ("410", 410, "gone"), ("404", 404, "gone")]
)
def test_only_the_declared_statuses_mean_already_closed(
    stack: SessionStack,
    endpoint: Endpoint,
    monkeypatch: pytest.MonkeyPatch,
    gone: str,
    answered: int,
    expected: str | None,
) -> None:
    monkeypatch.setenv("CLOSE_GONE_STATUSES", gone)
    endpoint.answer = close_endpoint.status(answered, body=b"no such route")

    result = closed(stack, "conn-gone")

    if expected == "gone":
        assert result.status is ActionStatus.ALREADY_DONE
    else:  # a wrong path answers 404 too: not counted closed
        assert result.status is ActionStatus.FAILED and result.permanent and "no such route" in (result.error or "")


def test_a_close_answered_a_byte_at_a_time_ends_by_its_deadline(stack: SessionStack, endpoint: Endpoint) -> None:
    endpoint.answer = close_endpoint.trickled

    result = closed(stack, "conn-slow", Deadline.after(8))

    assert result.status is ActionStatus.FAILED and not result.permanent  # a retry: it may not have been answered
    assert "Timeout" in (result.error or "")
    wait_for(endpoint.hung_up.is_set, "the worker hanging up on the trickled answer")


def test_an_answer_that_is_not_http_is_a_retry(stack: SessionStack, endpoint: Endpoint) -> None:
    endpoint.answer = close_endpoint.garbled

    result = closed(stack, "conn-garbled")

    assert result.status is ActionStatus.FAILED and not result.permanent and "BadStatusLine" in (result.error or "")


def check_line(capsys: pytest.CaptureFixture[str]) -> str:
    cli.main(["check"])
    [line] = [line for line in capsys.readouterr().out.splitlines() if "http-close" in line]
    return line


@pytest.mark.parametrize(("answered", "passes"), [(410, True), (404, False), (200, False), (302, False)])
def test_check_sends_a_close_for_a_made_up_id_and_expects_exactly_the_gone_answer(
    worker_env: SessionStack, endpoint: Endpoint, capsys: pytest.CaptureFixture[str], answered: int, passes: bool
) -> None:
    endpoint.answer = close_endpoint.status(answered, {"Location": "https://elsewhere.example/"})

    line = check_line(capsys)

    assert line.startswith("ok   " if passes else "FAIL ")
    [(method, target, _)] = endpoint.requests
    assert method == "DELETE" and target.startswith("/@connections/cleanup-worker-check-")
    if answered == 404:
        assert "CLOSE_GONE_STATUSES=404" in line and "fix CLOSE_URL" in line


def test_check_says_when_the_close_url_is_not_set(
    worker_env: SessionStack, endpoint: Endpoint, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CLOSE_URL")

    line = check_line(capsys)

    assert line.startswith("FAIL ") and "CLOSE_URL: not set" in line and endpoint.requests == []
