"""Shared fixtures: one moto server over HTTP for the whole run, and a fresh session stack per test."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest

from cleanup.aws import permits
from cleanup.telemetry import LOGGER_NAME
from schemas.settings import Settings
from tests.stack import SessionStack
from tests.versions import VERSION_MODULES
from worker.local.backend import LocalAws
from worker.local.gateway import LocalGateway


@pytest.fixture(autouse=True)
def worker_logger() -> Iterator[None]:
    """The worker's logger as it was before each test. A command run in a test points it at that test's captured
    stderr (and stops propagation): left so, the next test's records would go to a closed stream instead of to
    pytest's log capture."""
    logger = logging.getLogger(LOGGER_NAME)
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


@pytest.fixture(scope="session")
def aws() -> Iterator[LocalAws]:
    """A moto server on 127.0.0.1; boto3 in this process is pointed at it for the whole run. A client made from boto3's
    default session (as a kind that is not built in could make one) is held to the send-time check as the worker's
    own are; the tests' own clients come from a session of their own (``tests.stack.client``)."""
    saved = dict(os.environ)
    with LocalAws() as server:
        server.use()
        permits.check_default_session(
            permits.SendCheck(Settings.model_construct().fence_read_max_age_seconds, strict=True)
        )
        yield server
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def freeing_calls_carry_permits(request: pytest.FixtureRequest) -> Iterator[None]:
    """The one rule, watched over the whole suite: a freeing call made without a permit that covers it (a call site
    outside its gate) fails the test that made it, whatever the test was about. The send-time check refused it, and
    nothing was sent; a test that makes one on purpose says so (``@pytest.mark.freeing_refused``)."""
    refused: list[permits.Violation] = []
    with permits.observed(refused.append):
        yield
    bugs = [violation for violation in refused if violation.bug]
    if bugs and request.node.get_closest_marker("freeing_refused") is None:
        pytest.fail(f"a freeing call without a permit: {bugs[0].what} {bugs[0].targets[:3]}: {bugs[0].why}")


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
        "INTEGRITY_KEY_ID": stack.mac_key_arn,
        "SESSION_TABLE": stack.table,
        "WS_CALLBACK_URL": stack.aws.endpoint_url,
        "METRICS_DESTINATION": "off",
        "RETRY_MAX_WAIT_SECONDS": "0.05",
        "POLL_INTERVAL_SECONDS": "0.05",
    }.items():
        monkeypatch.setenv(name, value)
    return stack


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (the default): two workers a core. The suite's tests wait about half their time on servers,
    subprocesses and conditions (at one worker a core, the whole suite kept 54% of two cores busy), so a second
    worker a core fills those waits. That is the load of two suites at one worker a core, which the tests' bounds
    allow for."""
    return 2 * (os.cpu_count() or 1)


LONG_IN_A_FRESH_VENV = {"test_quality::test_mypy_strict_passes_on_the_packages"}  # mypy's cache cold: a minute


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the version tests (``tests.versions``): CI's version tiers run them (``pytest -m versions``). Then the
    long tests first (the slow tier's, and those long in a fresh venv): the workers steal the short ones from each
    other's queues (``--dist worksteal``), so no worker is left running a long test alone at the end."""

    def test(item: pytest.Item) -> str:  # module::test, parameters left out
        return f"{item.path.stem}::{getattr(item, 'originalname', item.name)}"

    for item in items:
        if item.path.stem in VERSION_MODULES or test(item) in VERSION_MODULES:
            item.add_marker(pytest.mark.versions)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None and test(item) not in LONG_IN_A_FRESH_VENV)
