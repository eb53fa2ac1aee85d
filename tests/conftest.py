"""Shared fixtures: one moto server over HTTP for the whole run, and a fresh session stack per test."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.stack import SessionStack
from worker.local.backend import LocalAws


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


from worker.local.gateway import LocalGateway  # noqa: E402


@pytest.fixture(scope="session")
def gateway() -> Iterator[LocalGateway]:
    """A local WebSocket gateway (real sockets and the @connections Management API) for the whole run."""
    with LocalGateway() as running:
        yield running
