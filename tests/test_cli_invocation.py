"""A command's shared options reach the command without touching the process's environment: ``--region``,
``--profile`` and ``--endpoint-url`` go to the client factory, and the settings' environment (a one-shot command's
quiet output, a deployed function's settings) is the command's own (``worker.shared_options.Invocation``)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import pytest

from cleanup.aws.clients import Reach
from worker import cli, shared_options, status


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """``status`` replaced by a command that notes the process's environment and its invocation while it runs."""
    config = tmp_path / "config"
    config.write_text("[profile operators]\nregion = ap-south-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.delenv("LOG_LEVEL", raising=False)
    monkeypatch.delenv("METRICS_DESTINATION", raising=False)
    noted: dict[str, Any] = {}

    def noting(args: argparse.Namespace) -> int:
        noted["environ"] = dict(os.environ)
        noted["invocation"] = shared_options.of(args)
        noted["client"] = shared_options.clients(args, shared_options.settings(args)).get("dynamodb")
        return 0

    monkeypatch.setattr(status, "main", noting)
    return noted


def test_the_aws_options_go_to_the_clients_and_the_process_environment_is_left_alone(seen: dict[str, Any]) -> None:
    before = dict(os.environ)
    endpoint = "http://127.0.0.1:9"
    argv = ["status", "--region", "eu-west-3", "--profile", "operators", "--endpoint-url", endpoint]

    assert cli.main(argv) == 0

    assert seen["environ"] == before  # while the command ran, not only after it
    assert seen["invocation"].reach == Reach(region="eu-west-3", profile="operators", endpoint_url=endpoint)
    assert seen["client"].meta.region_name == "eu-west-3"
    assert seen["client"].meta.endpoint_url == endpoint


def test_a_one_shot_command_is_quiet_through_its_own_settings_not_the_process_environment(
    seen: dict[str, Any],
) -> None:
    assert cli.main(["status", "--region", "us-east-1"]) == 0

    assert "LOG_LEVEL" not in seen["environ"] and "METRICS_DESTINATION" not in seen["environ"]
    environ = seen["invocation"].environ
    assert (environ["LOG_LEVEL"], environ["METRICS_DESTINATION"]) == ("WARNING", "off")


def test_aws_region_is_the_clients_region_when_aws_default_region_is_unset(
    seen: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("AWS_REGION", "sa-east-1")  # Lambda's and many containers' variable, which botocore ignores

    assert cli.main(["status"]) == 0

    assert "AWS_DEFAULT_REGION" not in seen["environ"]
    assert seen["client"].meta.region_name == "sa-east-1"
