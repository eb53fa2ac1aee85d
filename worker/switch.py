"""``cleanup-worker switch status|pause|dry-run|resume``: read or flip the kill switch in AppConfig.

``pause``, ``dry-run`` and ``resume`` write the profile's flag as a new hosted version and deploy it
(``cleanup.operations.switch``); ``status`` shows what the environment has deployed. The switch is named by the
worker's own settings (APPCONFIG_APPLICATION, APPCONFIG_ENVIRONMENT, APPCONFIG_PROFILE: the stack's ``KillSwitch``
output) or the options. Exit 0 once AppConfig took the change (or answered the status); 2 when no switch is named or no
strategy can be found; 1 when AppConfig refused or failed.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, cast

from cleanup.aws.clients import Clients
from cleanup.exceptions import MissingConfigError
from cleanup.operations.switch import VALUES, Deployed, Switch, flip, status
from worker import shared_options
from worker.exit_codes import ExitCode

if TYPE_CHECKING:
    from mypy_boto3_appconfig import AppConfigClient

CHANGES = ("status", *VALUES)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("change", choices=CHANGES, help="show the deployed mode, or pause, turn to a dry run, resume")
    parser.add_argument("--application", help="the AppConfig application id [APPCONFIG_APPLICATION]")
    parser.add_argument("--environment", help="its environment id [APPCONFIG_ENVIRONMENT]")
    parser.add_argument("--configuration-profile", help="its feature-flag profile id [APPCONFIG_PROFILE]")
    parser.add_argument(
        "--strategy",
        help="the deployment strategy: one that deploys at once (the stack's KillSwitchStrategyId) [the strategy of "
        "the environment's latest deployment of the profile]",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def appconfig(clients: Clients) -> AppConfigClient:
    """AppConfig's control-plane client."""
    return cast("AppConfigClient", clients.get("appconfig"))


def main(args: argparse.Namespace) -> int:
    """Flip the switch, or show it; one line (or one JSON object) on stdout."""
    settings = shared_options.settings(args)
    names = (
        args.application or settings.appconfig_application,
        args.environment or settings.appconfig_environment,
        args.configuration_profile or settings.appconfig_profile,
    )
    if not all(names):
        raise MissingConfigError(
            "no kill switch named: pass --application, --environment and --configuration-profile, or set "
            "APPCONFIG_APPLICATION, APPCONFIG_ENVIRONMENT and APPCONFIG_PROFILE (the stack's KillSwitch output)"
        )
    switch = Switch(*(str(name) for name in names))
    client = appconfig(shared_options.clients(args, settings))
    reading = args.change == "status"
    deployed = status(client, switch) if reading else flip(client, switch, args.change, args.strategy)
    print(json.dumps(_summary(switch, deployed)) if args.json else _line(deployed))
    return ExitCode.OK


def _summary(switch: Switch, deployed: Deployed | None) -> dict[str, object]:
    where = {"application": switch.application, "environment": switch.environment, "profile": switch.profile}
    return {**where, **(deployed.as_dict() if deployed else {"mode": None})}


def _line(deployed: Deployed | None) -> str:
    if deployed is None:
        return "never deployed: no deployment of the profile to the environment (workers hold, the switch unknown)"
    return (
        f"{deployed.mode:<8} version {deployed.version}, deployment {deployed.deployment}: {deployed.state} "
        f"(strategy {deployed.strategy})"
    )
