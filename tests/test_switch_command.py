"""``cleanup-worker switch``: a change is a hosted version of the flag (written to moto over HTTP) deployed with the
strategy given; the worker's kill switch then reads the new mode from the agent.

moto keeps AppConfig's applications, profiles and hosted versions, not its environments, strategies or deployments:
those are answered by ``tests.appconfig_deployments`` (an immediate strategy's deployment, complete at once), which
serves each deployed version on the local agent as AppConfig's agent and Lambda extension would.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from benchmarks.stack import source_template
from cleanup.killswitch import KillSwitch, Mode
from cleanup.operations.switch import VALUES, profile_document
from cleanup.telemetry import Metrics, MetricsSink
from schemas.settings import Settings
from tests.appconfig_deployments import Deployments
from tests.stack import client
from worker import cli
from worker import switch as command
from worker.local.appconfig import LocalAgent


@pytest.fixture
def flag(aws: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[LocalAgent, Deployments]]:
    """A feature-flag profile in moto, the agent serving what is deployed, and the command's client made to deploy."""
    appconfig = client("appconfig")
    application = appconfig.create_application(Name=f"cleanup-{uuid.uuid4().hex[:6]}")["Id"]
    profile = appconfig.create_configuration_profile(
        ApplicationId=application, Name="cleanup-switch", LocationUri="hosted", Type="AWS.AppConfig.FeatureFlags"
    )["Id"]
    with LocalAgent(application, "prod", profile) as agent:
        deployments = Deployments(agent, appconfig)
        made = command.appconfig
        monkeypatch.setattr(command, "appconfig", lambda settings: deployments.attach(made(settings)))
        for name, value in agent.env().items():
            monkeypatch.setenv(name, value)
        yield agent, deployments


def switch(settings: Settings) -> KillSwitch:
    return KillSwitch(settings, Metrics(settings, MetricsSink("off")))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["switch", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(("change", "mode"), [("pause", Mode.PAUSED), ("dry-run", Mode.DRY_RUN)])
def test_a_change_is_a_hosted_version_deployed_and_the_worker_takes_its_mode(
    flag: tuple[LocalAgent, Deployments], capsys: pytest.CaptureFixture[str], change: str, mode: Mode
) -> None:
    agent, deployments = flag
    reading = switch(Settings())  # the worker's own, on the agent; CLEANUP_MODE enforce
    assert reading.mode() is Mode.ENFORCE

    code, out, _ = run(capsys, change, "--strategy", "immediate")

    application, _, profile = agent.names
    [deployed] = deployments.made
    version = client("appconfig").get_hosted_configuration_version(
        ApplicationId=application, ConfigurationProfileId=profile, VersionNumber=int(deployed["ConfigurationVersion"])
    )
    assert code == 0 and out.startswith(f"{mode.value} ")
    assert json.loads(version["Content"].read()) == json.loads(profile_document(VALUES[change]))
    assert deployed["DeploymentStrategyId"] == "immediate"
    assert reading.mode() is mode


def test_resume_after_a_pause_takes_the_same_strategy_and_status_says_so(
    flag: tuple[LocalAgent, Deployments], capsys: pytest.CaptureFixture[str]
) -> None:
    _, deployments = flag
    reading = switch(Settings())
    run(capsys, "pause", "--strategy", "immediate")
    assert reading.mode() is Mode.PAUSED

    code, _, _ = run(capsys, "resume")  # the strategy of the latest deployment
    _, out, _ = run(capsys, "status", "--json")

    assert code == 0 and reading.mode() is Mode.ENFORCE
    assert [d["DeploymentStrategyId"] for d in deployments.made] == ["immediate", "immediate"]
    summary = json.loads(out)
    assert (summary["mode"], summary["version"], summary["deployment"], summary["state"]) == (
        "enforce",
        2,
        2,
        "COMPLETE",
    )


def test_without_a_strategy_or_a_deployment_to_take_one_from_it_refuses_in_one_line(
    flag: tuple[LocalAgent, Deployments], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "pause")

    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "--strategy" in err and "KillSwitchStrategyId" in err


def test_a_deployment_in_progress_leaves_the_version_written_and_says_how_to_go_on(
    flag: tuple[LocalAgent, Deployments], capsys: pytest.CaptureFixture[str]
) -> None:
    _, deployments = flag
    reading = switch(Settings())
    deployments.busy = True

    code, _, err = run(capsys, "pause", "--strategy", "immediate")

    assert code == 1 and err.count("\n") == 1
    assert "version 1 (pause) is written but not deployed" in err and "stop-deployment" in err
    assert reading.mode() is Mode.ENFORCE and deployments.made == []


def test_status_before_any_deployment_says_the_workers_hold(
    flag: tuple[LocalAgent, Deployments], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "status")

    assert code == 0 and out.startswith("never deployed")


def test_without_a_switch_named_it_refuses_in_one_line(
    aws: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("APPCONFIG_APPLICATION", "APPCONFIG_ENVIRONMENT", "APPCONFIG_PROFILE"):
        monkeypatch.delenv(name, raising=False)

    code, out, err = run(capsys, "pause", "--strategy", "immediate")

    assert (code, out) == (2, "") and err.count("\n") == 1 and "--configuration-profile" in err


def test_the_stacks_own_first_version_is_the_document_resume_writes() -> None:
    created = source_template()["Resources"]["KillSwitchEnforce"]["Properties"]["Content"]

    assert json.loads(created) == json.loads(profile_document(VALUES["resume"]))
