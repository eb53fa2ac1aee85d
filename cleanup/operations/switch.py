"""Flipping the kill switch (``cleanup.killswitch`` reads it): a new hosted version of the feature-flag
profile, deployed at once, and what the environment has deployed now.

A change is two calls to AppConfig's control plane: CreateHostedConfigurationVersion (the profile's whole document,
in the feature-flag format, its ``cleanup`` flag set to the mode asked for), then StartDeployment of that version to
the environment with a deployment strategy. The strategy should deploy at once and bake for no time (the template's
``KillSwitchStrategyId``, made when ``CreateKillSwitch=true``): an environment takes one deployment at a time, and a
pause followed by its resume must not wait for a bake. Without one given, the strategy of the environment's latest
deployment of the profile is used. Workers read the deployed flag through the AppConfig agent or Lambda extension,
which polls AppConfig (every 45 s by default), and keep a reading for APPCONFIG_POLL_SECONDS: a change reaches every
process within about a minute.

The status is the environment's latest deployment of the profile (ListDeployments, then GetDeployment, newest first)
and the flag in the version it deploys (GetHostedConfigurationVersion).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from cleanup.aws.aws_errors import error_code
from cleanup.aws.calls import call
from cleanup.exceptions import MissingConfigError, PermanentError
from cleanup.killswitch import FLAG, Mode, read_flag

if TYPE_CHECKING:
    from mypy_boto3_appconfig import AppConfigClient

VALUES: dict[str, dict[str, Any]] = {
    "pause": {"enabled": False},
    "dry-run": {"enabled": True, "mode": Mode.DRY_RUN.value},
    "resume": {"enabled": True, "mode": Mode.ENFORCE.value},
}
"""The flag's values for each change."""
RECENT = 10  # deployments looked through for the profile's latest


@dataclass(frozen=True)
class Switch:
    """Where the flag lives: the application, environment and feature-flag profile (ids)."""

    application: str
    environment: str
    profile: str


@dataclass(frozen=True)
class Deployed:
    """One deployment of the flag: what it sets and how far it is."""

    mode: str
    version: int
    deployment: int | None
    state: str
    strategy: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def profile_document(values: Mapping[str, Any]) -> str:
    """A feature-flag profile's document holding the one flag ``cleanup`` (its ``mode`` attribute constrained to
    enforce or dry-run), with ``values``."""
    attribute = {"constraints": {"type": "string", "enum": [Mode.ENFORCE.value, Mode.DRY_RUN.value]}}
    flags = {FLAG: {"name": FLAG, "attributes": {"mode": attribute}}}
    return json.dumps({"version": "1", "flags": flags, "values": {FLAG: dict(values)}}, sort_keys=True)


def served(document: bytes) -> bytes:
    """The flag as the agent and the Lambda extension serve a feature-flag profile's document: its values alone.

    Raises:
        ValueError: the document is not a feature-flag document with values.
    """
    values = json.loads(document).get("values")
    if not isinstance(values, dict):
        raise ValueError("the version is not a feature-flag document with values")
    return json.dumps(values).encode()


def flip(client: AppConfigClient, switch: Switch, change: str, strategy: str | None = None) -> Deployed:
    """Write the flag for ``change`` (pause, dry-run, resume) as a new hosted version, and deploy it.

    Raises:
        MissingConfigError: no strategy given and the environment has no deployment of the profile to take one from.
        TransientError / PermanentError: AppConfig refused or failed (a deployment in progress: ConflictException).
    """
    strategy = strategy or _latest_strategy(client, switch)
    if strategy is None:
        raise MissingConfigError(
            "no deployment strategy: pass --strategy (the stack's KillSwitchStrategyId output, a strategy that "
            "deploys at once and bakes for no time)"
        )
    created = call(
        client.create_hosted_configuration_version,
        "CreateHostedConfigurationVersion",
        None,
        ApplicationId=switch.application,
        ConfigurationProfileId=switch.profile,
        Content=profile_document(VALUES[change]).encode(),
        ContentType="application/json",
        Description=f"cleanup-worker switch {change}",
    )
    version = int(created["VersionNumber"])
    try:
        started = call(
            client.start_deployment,
            "StartDeployment",
            None,
            ApplicationId=switch.application,
            EnvironmentId=switch.environment,
            DeploymentStrategyId=strategy,
            ConfigurationProfileId=switch.profile,
            ConfigurationVersion=str(version),
            Description=f"cleanup-worker switch {change}",
        )
    except PermanentError as exc:
        cause = exc.__cause__
        if not isinstance(cause, ClientError) or error_code(cause) != "ConflictException":
            raise
        raise PermanentError(
            f"version {version} ({change}) is written but not deployed: a deployment is in progress on environment "
            f"{switch.environment!r}; run this again once it ends (seconds with an immediate strategy), or stop it: "
            f"aws appconfig stop-deployment --application-id {switch.application} --environment-id "
            f"{switch.environment} --deployment-number <its number>"
        ) from exc
    number, state = started.get("DeploymentNumber"), started.get("State", "?")
    return Deployed(_mode(VALUES[change]), version, number, state, strategy)


def status(client: AppConfigClient, switch: Switch) -> Deployed | None:
    """The environment's latest deployment of the profile and the mode its version sets (None: never deployed)."""
    latest = _latest(client, switch)
    if latest is None:
        return None
    version = int(latest["ConfigurationVersion"])
    got = call(
        client.get_hosted_configuration_version,
        "GetHostedConfigurationVersion",
        None,
        ApplicationId=switch.application,
        ConfigurationProfileId=switch.profile,
        VersionNumber=version,
    )
    try:
        mode = read_flag(served(got["Content"].read())).value
    except ValueError as exc:
        raise PermanentError(f"version {version} of the profile is not the kill switch's flag: {exc}") from exc
    return Deployed(mode, version, latest.get("DeploymentNumber"), latest.get("State", "?"), latest.get("strategy"))


def _mode(values: Mapping[str, Any]) -> str:
    return str(values.get("mode", Mode.ENFORCE.value)) if values["enabled"] else Mode.PAUSED.value


def _latest_strategy(client: AppConfigClient, switch: Switch) -> str | None:
    latest = _latest(client, switch)
    return None if latest is None else latest.get("strategy")


def _latest(client: AppConfigClient, switch: Switch) -> dict[str, Any] | None:
    """The newest deployment of the profile to the environment (GetDeployment's fields, ``strategy`` among them)."""
    listed = call(
        client.list_deployments,
        "ListDeployments",
        None,
        ApplicationId=switch.application,
        EnvironmentId=switch.environment,
        MaxResults=RECENT,
    )
    for summary in sorted(listed.get("Items", []), key=lambda item: -int(item.get("DeploymentNumber", 0))):
        found = call(
            client.get_deployment,
            "GetDeployment",
            None,
            ApplicationId=switch.application,
            EnvironmentId=switch.environment,
            DeploymentNumber=int(summary["DeploymentNumber"]),
        )
        if found.get("ConfigurationProfileId") == switch.profile:
            return {**found, "strategy": found.get("DeploymentStrategyId")}
    return None
