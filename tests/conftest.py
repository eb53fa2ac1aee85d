"""Shared fixtures: one moto server over HTTP for the whole run, and a fresh session stack per test."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.stack import SessionStack
from worker.local.backend import LocalAws
from worker.local.gateway import LocalGateway


@pytest.fixture(scope="session")
def aws() -> Iterator[LocalAws]:
    """A moto server on 127.0.0.1; boto3 in this process is pointed at it for the whole run."""
    saved = dict(os.environ)
    with LocalAws() as server:
        server.use()
        yield server
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def stack(aws: LocalAws, request: pytest.FixtureRequest) -> SessionStack:
    """A session table (TTL + NEW_AND_OLD_IMAGES stream), a scratch bucket and a KMS key of this test's own."""
    return SessionStack.create(aws, request.node.name)


@pytest.fixture(scope="session")
def gateway() -> Iterator[LocalGateway]:
    """A local WebSocket gateway (real sockets and the @connections Management API) for the whole run."""
    with LocalGateway() as running:
        yield running


@pytest.fixture
def worker_env(stack: SessionStack, monkeypatch: pytest.MonkeyPatch) -> SessionStack:
    """The worker's settings, in the environment as a command reads them, pointed at this test's stack."""
    for name, value in {
        "SCRATCH_BUCKET": stack.bucket,
        "KMS_KEY_ID": stack.key_arn,
        "SESSION_TABLE": stack.table,
        "WS_CALLBACK_URL": stack.aws.endpoint_url,
        "METRICS_DESTINATION": "off",
        "RETRY_MAX_WAIT_SECONDS": "0.05",
        "POLL_INTERVAL_SECONDS": "0.05",
    }.items():
        monkeypatch.setenv(name, value)
    return stack
