"""How the deployment builds and runs: the build backend is pinned with its hash wherever the project is built (the
Lambda artifact and both images), the images keep no installer, and the template offers a permissions boundary, the
cleanup function's reserved concurrency and an alarm while the kill switch pauses cleanup."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.test_template import ROOT, function, parameter, resolved, resources, source_template

BUILD_LOCK = ROOT / "deploy" / "build-requirements.txt"
MAKEFILE = ROOT / "deploy" / "Makefile"
DOCKERFILES = [ROOT / "deploy" / "container" / name for name in ("Dockerfile", "Dockerfile.kcl")]


def pinned() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of the build lock."""
    text = BUILD_LOCK.read_text().replace("\\\n", " ")
    found = {}
    for line in text.splitlines():
        match = re.match(r"([A-Za-z0-9._-]+)==(\S+)", line)
        if match:
            found[match.group(1).lower()] = (match.group(2), re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
    return found


def test_the_build_backend_is_pinned_with_a_hash_to_a_version_pyproject_accepts() -> None:
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
    [requirement] = [Requirement(r) for r in build["requires"]]
    version, hashes = pinned()[requirement.name]

    assert build["build-backend"] == "setuptools.build_meta"
    assert requirement.specifier.contains(version) and hashes


def test_the_makefile_builds_the_project_with_the_pinned_backend_only() -> None:
    text = MAKEFILE.read_text()
    builds = [line for line in text.splitlines() if re.search(r"pip (wheel|install)\b.*(\s\.$|\s\.\s)", line)]

    assert builds and all("--no-build-isolation" in line for line in builds)
    assert re.search(r"pip install .*--require-hashes .*-r \$\(BUILD_LOCK\)", text)
    assert "BUILD_LOCK ?= deploy/build-requirements.txt" in text


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_the_image_builds_with_the_pinned_backend_and_keeps_no_installer(dockerfile: Path) -> None:
    text = dockerfile.read_text().replace("\\\n", " ")
    ignore = (dockerfile.parent / f"{dockerfile.name}.dockerignore").read_text().splitlines()
    project = [line for line in text.splitlines() if re.search(r"pip install [^&]*\s\.(\s|$)", line)]

    assert "COPY deploy/build-requirements.txt ./build.lock" in text and "!deploy/build-requirements.txt" in ignore
    assert "--require-hashes --no-deps --only-binary=:all: -r build.lock" in text
    assert project and all("--no-build-isolation" in line for line in project)
    assert re.search(r"pip uninstall -y (setuptools pip|pip setuptools)\b", text)  # nothing in the image installs


@pytest.mark.parametrize("bounded", [True, False])
def test_every_role_takes_the_permissions_boundary_when_one_is_given(bounded: bool) -> None:
    for name, role in resources("AWS::IAM::Role").items():
        boundary = resolved(role["Properties"]["PermissionsBoundary"], HasPermissionsBoundary=bounded)
        assert boundary == ({"Ref": "PermissionsBoundaryArn"} if bounded else {"Ref": "AWS::NoValue"}), name
    assert re.fullmatch(parameter("PermissionsBoundaryArn")["AllowedPattern"], "arn:aws:iam::123456789012:policy/pb")


@pytest.mark.parametrize("reserved", [True, False])
def test_the_cleanup_function_takes_reserved_concurrency_when_given(reserved: bool) -> None:
    properties = function("worker.lambda_handler.handler")["Properties"]
    value = resolved(properties["ReservedConcurrentExecutions"], HasCleanupReservedConcurrency=reserved)

    assert value == ({"Ref": "CleanupReservedConcurrency"} if reserved else {"Ref": "AWS::NoValue"})
    assert source_template()["Conditions"]["HasCleanupReservedConcurrency"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "CleanupReservedConcurrency"}, 0]}]
    }


def test_a_paused_kill_switch_raises_an_alarm() -> None:
    # While paused, expired sessions keep their grants usable: an operator must know.
    alarm = resources("AWS::CloudWatch::Alarm")["KillSwitchPausedAlarm"]["Properties"]
    stats = {m["Id"]: m["MetricStat"]["Metric"] for m in alarm["Metrics"] if "MetricStat" in m}

    assert {s["MetricName"] for s in stats.values()} == {"PausedBatches", "ModeChanges"}
    [changed] = [s for s in stats.values() if s["MetricName"] == "ModeChanges"]
    assert {"Name": "Mode", "Value": "paused"} in changed["Dimensions"]
    assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (0, "GreaterThanThreshold")


def test_the_project_is_built_once_into_a_layer_every_function_runs_from() -> None:
    # SAM builds each resource whose BuildMethod is makefile on its own, even when several share their code: the
    # project is one makefile layer, and the functions share one plain code folder (built once for them all).
    template = source_template()
    layer = template["Resources"]["RuntimeLayer"]
    functions = {n: r for n, r in template["Resources"].items() if r["Type"] == "AWS::Serverless::Function"}
    makefile_built = [n for n, r in template["Resources"].items() if r.get("Metadata", {}).get("BuildMethod")]

    assert makefile_built == ["RuntimeLayer"] and layer["Metadata"]["BuildArchitecture"] == "arm64"
    assert layer["Properties"]["CompatibleRuntimes"] == [template["Globals"]["Function"]["Runtime"]]
    assert template["Globals"]["Function"]["CodeUri"] == "function/"
    assert all("CodeUri" not in r["Properties"] for r in functions.values())
    assert sorted(p.name for p in (ROOT / "deploy" / "function").iterdir()) == ["README.md"]
    assert re.search(r"(?m)^build-RuntimeLayer:$", MAKEFILE.read_text())
    assert "$(ARTIFACTS_DIR)/python" in MAKEFILE.read_text()  # a Python layer's packages, on /opt/python
