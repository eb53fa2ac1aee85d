"""The guard refuses every prefix that could reach outside the session's own scratch area."""

from __future__ import annotations

import pytest

from cleanup.core.guard import ScratchLocation, callback_endpoint, resolve_prefix
from cleanup.exceptions import MissingConfigError, RefusedEndpointError, UnsafePrefixError
from schemas.settings import Settings

SETTINGS = Settings(scratch_bucket="scratch", scratch_root="sessions/")


@pytest.mark.parametrize(
    "prefix",
    [
        "",
        "/",
        "sessions/",
        "sessions",
        "sessions/t1/abc",
        "sessions/../other/",
        "sessions/t1/../../",
        "sessions/./t1/",
        "sessions//",
        "sessions/t1//",
        "sessions/%2e%2e/other/",
        "sessions/%2E%2E/",
        "sessions/t1%2f..%2f/",
        "sessions/t1\\..\\/",
        "/sessions/t1/abc/",
        "other/t1/abc/",
        "sessionsX/t1/",
        "s3://other-bucket/sessions/t1/abc/",
        "s3://scratch/",
        "s3://scratch/sessions/",
        "https://scratch/sessions/t1/abc/",
        "sessions/t1/\nabc/",
    ],
)
def test_unsafe_prefixes_are_refused(prefix: str) -> None:
    with pytest.raises(UnsafePrefixError):
        resolve_prefix(prefix, SETTINGS)


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("sessions/t1/abc/", ScratchLocation("scratch", "sessions/t1/abc/")),
        ("s3://scratch/sessions/t1/abc/", ScratchLocation("scratch", "sessions/t1/abc/")),
        ("sessions/abc/", ScratchLocation("scratch", "sessions/abc/")),
    ],
)
def test_prefixes_strictly_under_the_root_are_accepted(prefix: str, expected: ScratchLocation) -> None:
    assert resolve_prefix(prefix, SETTINGS) == expected


def test_tenant_scoping_refuses_another_tenants_area() -> None:
    settings = Settings(scratch_bucket="scratch", scratch_tenant_scoped=True)
    assert resolve_prefix("sessions/t1/abc/", settings, "t1").prefix == "sessions/t1/abc/"
    with pytest.raises(UnsafePrefixError):
        resolve_prefix("sessions/t2/abc/", settings, "t1")
    with pytest.raises(UnsafePrefixError):
        resolve_prefix("sessions/t1/", settings, "t1")


def test_without_a_configured_bucket_nothing_is_deleted() -> None:
    with pytest.raises(MissingConfigError, match="SCRATCH_BUCKET"):
        resolve_prefix("sessions/t1/abc/", Settings())


@pytest.mark.parametrize("root", ["", "/", "sessions", "/sessions/", "a//", "../x/"])
def test_an_unsafe_scratch_root_is_a_configuration_error(root: str) -> None:
    with pytest.raises(ValueError, match="SCRATCH_ROOT"):
        Settings(scratch_root=root)


CALLBACK = "https://abcdef1234.execute-api.eu-west-1.amazonaws.com/prod"


@pytest.mark.parametrize(
    ("item_url", "settings", "expected"),
    [
        (None, Settings(ws_callback_url=CALLBACK), CALLBACK),
        ("", Settings(ws_callback_url=CALLBACK), CALLBACK),
        (CALLBACK + "/", Settings(ws_callback_url=CALLBACK), CALLBACK + "/"),
        (
            "https://zyxwvu9876.execute-api.us-east-1.amazonaws.com/dev/",
            Settings(
                ws_callback_url=CALLBACK,
                allowed_callback_urls="https://zyxwvu9876.execute-api.us-east-1.amazonaws.com/dev",
            ),
            None,
        ),
        (
            "https://ws.example.com/v1",
            Settings(allowed_callback_urls="https://a.test/x, https://ws.example.com/v1/"),
            None,
        ),
    ],
)
def test_the_callback_endpoint_is_the_configured_one_or_an_allowed_one(
    item_url: str | None, settings: Settings, expected: str | None
) -> None:
    assert callback_endpoint(item_url, settings) == (expected or item_url)


@pytest.mark.parametrize(
    "item_url",
    [
        "https://evil.example/prod",
        "http://abcdef1234.execute-api.eu-west-1.amazonaws.com/prod",
        "https://abcdef1234.execute-api.eu-west-1.amazonaws.com.evil.example/prod",
        "https://abcdef1234.execute-api.eu-west-1.amazonaws.com@evil.example/prod",
        "http://169.254.169.254/latest",
    ],
)
def test_an_item_cannot_send_the_workers_signed_requests_elsewhere(item_url: str) -> None:
    with pytest.raises(RefusedEndpointError, match="ALLOWED_CALLBACK_URLS"):
        callback_endpoint(item_url, Settings(ws_callback_url=CALLBACK))


@pytest.mark.parametrize(
    "item_url",
    [
        "https://zyxwvu9876.execute-api.eu-west-1.amazonaws.com/prod",  # another API
        "https://abcdef1234.execute-api.eu-west-1.amazonaws.com/dev",  # another stage
        "https://abcdef1234.execute-api.us-east-1.amazonaws.com/prod",  # the same id in another region
        "https://zyxwvu9876.execute-api.us-east-1.amazonaws.com/dev",
    ],
)
def test_an_execute_api_endpoint_other_than_the_configured_apis_and_stages_is_refused(item_url: str) -> None:
    settings = Settings(ws_callback_url=CALLBACK, allowed_callback_urls="https://ws.example.com/v1")

    with pytest.raises(RefusedEndpointError, match="ALLOWED_CALLBACK_URLS"):
        callback_endpoint(item_url, settings)


def test_a_socket_with_no_endpoint_at_all_is_a_configuration_error() -> None:
    with pytest.raises(MissingConfigError, match="WS_CALLBACK_URL"):
        callback_endpoint(None, Settings())
