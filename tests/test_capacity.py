"""The capacity model's invariants: every session is either freed or counted lost, quotas bound what they bound, and
the backlog loses nothing where the worker without it discards most of a large burst."""

from __future__ import annotations

import pytest

from benchmarks.capacity import Backlog, Expiry, Mapping, Quotas, Worker, main, simulate

pytestmark = pytest.mark.timeout(60)

WITH_BACKLOG = Backlog(enabled=True)
LOSSLESS = Mapping(record_age=-1, parallelization=4)


def test_a_burst_under_the_grant_quota_takes_sessions_over_the_quota() -> None:
    result = simulate(Expiry(10_000))

    assert result.grants_retired == pytest.approx(10_000 / 50, rel=0.05)
    assert result.lost == 0
    assert result.binding(Quotas())[0] == "kms"


def test_without_a_backlog_a_million_sessions_go_mostly_to_the_on_failure_queue() -> None:
    result = simulate(Expiry(1_000_000))

    cleaned_in_the_hour = 3600 * 50
    assert result.on_failure_records == pytest.approx(1_000_000 - cleaned_in_the_hour, rel=0.02)
    assert result.sockets_closed is None and result.grants_retired is None
    assert result.peak_iterator_age == pytest.approx(3600, abs=5)


@pytest.mark.parametrize("sessions", [1_000_000, 10_000_000])
def test_with_the_backlog_a_burst_loses_nothing_and_sockets_do_not_wait_for_grants(sessions: int) -> None:
    result = simulate(Expiry(sessions), LOSSLESS, backlog=WITH_BACKLOG)

    assert result.lost == 0
    assert result.grants_retired == pytest.approx(sessions / 50, rel=0.05)
    assert result.sockets_closed is not None and result.sockets_closed < result.grants_retired / 5
    assert result.peak_backlog_age < WITH_BACKLOG.retention


def test_a_stream_slower_than_its_retention_loses_the_records_it_cannot_reach() -> None:
    result = simulate(Expiry(20_000_000), Mapping(record_age=-1), backlog=WITH_BACKLOG)

    assert result.trimmed > 0
    assert result.lost == result.trimmed
    assert result.sockets_closed is None


def test_a_batch_larger_than_its_timeout_allows_is_retried_then_discarded() -> None:
    mapping = Mapping(batch_size=10_000, timeout=60, retry_attempts=0, record_age=-1)

    result = simulate(Expiry(10_000), mapping)

    retired_in_one_invocation = 50 * (60 - Worker().margin - Worker().overhead)
    assert result.on_failure_records == pytest.approx(10_000 - retired_in_one_invocation, abs=2)
    assert result.on_failure_messages == 1


def test_a_higher_quota_is_never_slower() -> None:
    slow = simulate(Expiry(200_000), LOSSLESS, quotas=Quotas(kms=50), backlog=WITH_BACKLOG)
    fast = simulate(Expiry(200_000), LOSSLESS, quotas=Quotas(kms=500), backlog=WITH_BACKLOG)

    assert fast.grants_retired is not None and slow.grants_retired is not None
    assert fast.grants_retired < slow.grants_retired


def test_sessions_expiring_at_a_rate_the_quota_allows_never_build_a_backlog_age() -> None:
    result = simulate(Expiry(20_000, rate=20.0), LOSSLESS, backlog=WITH_BACKLOG)

    assert result.lost == 0
    assert result.grants_retired == pytest.approx(20_000 / 20, rel=0.05)


def test_the_command_prints_a_row_naming_the_binding_quota(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--sessions", "5000", "--backlog", "--record-age", "-1"]) == 0

    out = capsys.readouterr().out
    assert "| this deployment | 5,000 |" in out
    assert "kms" in out
