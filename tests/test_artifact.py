"""What ships, built and run: the Lambda artifact as `sam build` makes it, the wheel and the sdist (slow: they install).

The artifact is built through deploy/Makefile's target, as SAM runs it (a copy of the sources as the working
directory, ARTIFACTS_DIR set), for the local platform, and each handler is loaded from it alone: an isolated
interpreter (``-I -S``: no site-packages, no environment paths) with only the artifact on ``sys.path``, cleaning
against the test's moto server.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.stack import SessionStack
from tests.test_sessions import add_expiry_index, get
from tests.test_sweep import session

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TEST_ONLY = ("moto", "pytest", "_pytest", "hypothesis", "aiohttp", "hypercorn", "websockets", "cfnlint", "mypy")
CALL = """
import json, sys
artifact = sys.argv[1]
sys.path.insert(0, artifact)
module = __import__(sys.argv[2], fromlist=["handler"])
result = module.handler(json.loads(sys.stdin.read()), None)
stdlib = sys.base_prefix
strays = sorted({getattr(m, "__file__", None) or "" for m in list(sys.modules.values())} - {""})
strays = [f for f in strays if not f.startswith((artifact, stdlib))]
print(json.dumps({"result": result, "strays": strays}))
"""


def lambda_python() -> str:
    """The runtime's Python (3.12) where pyenv has it, else this interpreter."""
    found = sorted(Path.home().glob(".pyenv/versions/3.12.*/bin/python3.12"))
    return str(found[-1]) if found else sys.executable


def version_of(python: str) -> str:
    command = [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """deploy/Makefile's build-RuntimeLayer, run as `sam build` runs it, for this machine's platform: the layer's
    python/ folder, which every function runs from."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    source = tmp_path_factory.mktemp("source") / "repo"
    ignore = shutil.ignore_patterns(
        ".venv", ".git", "*cache*", "__pycache__", "*.egg-info", "build", "dist", ".aws-sam"
    )
    shutil.copytree(ROOT, source, ignore=ignore)
    target = tmp_path_factory.mktemp("artifact")
    env = {
        **os.environ,
        "ARTIFACTS_DIR": str(target),
        "PYTHON": sys.executable,
        "PLATFORM": f"manylinux2014_{platform.machine()}",
        "LAMBDA_PYTHON": version_of(lambda_python()),
    }
    make = ["make", "-f", "deploy/Makefile", "build-RuntimeLayer"]
    result = subprocess.run(make, cwd=source, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [path.name for path in target.iterdir()] == ["python"]  # a layer: nothing beside its python/ folder
    return target / "python"


def invoke(artifact: Path, handler: str, event: dict[str, Any], stack: SessionStack) -> dict[str, Any]:
    env = {
        **stack.aws.environment(),
        "PATH": "/usr/bin:/bin",
        "SESSION_TABLE": stack.table,
        "SCRATCH_BUCKET": stack.bucket,
        "KMS_KEY_ID": stack.key_arn,
        "METRICS_DESTINATION": "off",
        "RETRY_MAX_WAIT_SECONDS": "0.05",
        "EXPIRY_INDEX": "expiry-index",
    }
    command = [lambda_python(), "-I", "-S", "-c", CALL, str(artifact), handler]
    run = subprocess.run(command, input=json.dumps(event), env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    answer: dict[str, Any] = json.loads(run.stdout.splitlines()[-1])
    assert answer["strays"] == []  # everything it imported came from the artifact or the standard library
    return dict(answer["result"])


def test_the_artifact_holds_no_bytecode_scripts_demo_or_test_packages(artifact: Path) -> None:
    assert list(artifact.rglob("*.pyc")) == []
    assert not (artifact / "bin").exists()
    assert not (artifact / "worker" / "local").exists()
    assert [name for name in TEST_ONLY if (artifact / name).exists()] == []
    assert [p.name for p in artifact.iterdir() if p.name.startswith(("mypy_boto3", "boto3_stubs", "tests"))] == []


def test_the_cleanup_handler_from_the_artifact_alone_cleans_a_session(artifact: Path, stack: SessionStack) -> None:
    item = stack.put_session("shipped")
    stack.delete("shipped")

    result = invoke(artifact, "worker.lambda_handler", stack.lambda_event(), stack)

    assert result == {"batchItemFailures": []}
    assert stack.objects(item["scratchPrefix"]) == []
    assert item["grantId"] not in stack.grant_ids()


def test_the_sweep_handler_from_the_artifact_alone_sweeps(artifact: Path, stack: SessionStack) -> None:
    add_expiry_index(stack)
    session(stack, "old", expires_in=-30)
    session(stack, "young", expires_in=600)

    result = invoke(artifact, "worker.sweep", {"source": "aws.scheduler"}, stack)

    assert result["swept"] == 1
    assert get(stack, "old") is None
    assert get(stack, "young") is not None


def below_a_floor(artifact: Path, into: Path) -> Path:
    """A copy of the artifact whose tenacity says 8.2.0 (below the 8.3 floor), as a shadowing layer would."""
    shutil.copytree(artifact, into)
    [info] = into.glob("tenacity-*.dist-info")
    metadata = info / "METADATA"
    metadata.write_text(re.sub(r"(?m)^Version: .*$", "Version: 8.2.0", metadata.read_text()))
    info.rename(into / "tenacity-8.2.0.dist-info")
    return into


def test_the_build_refuses_an_artifact_its_handlers_would_refuse(artifact: Path, tmp_path: Path) -> None:
    old = below_a_floor(artifact, tmp_path / "old" / "python")  # the layer's artifact directory is python/'s parent
    check = [
        "make",
        "-s",
        "-f",
        "deploy/Makefile",
        "check-artifact",
        f"ARTIFACTS_DIR={old.parent}",
        f"PYTHON={lambda_python()}",
    ]

    refused = subprocess.run(check, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    passed = subprocess.run(
        [*check[:-2], f"ARTIFACTS_DIR={artifact.parent}", check[-1]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert refused.returncode != 0 and passed.returncode == 0, passed.stdout + passed.stderr
    line = "tenacity 8.2.0 is installed, but session-cleanup-worker needs tenacity>="
    assert line in refused.stderr
    # The same versions the handler refuses at run time, with the same line.
    code = "import sys; sys.path.insert(0, sys.argv[1]); from worker.floors import core_problem; print(core_problem())"
    found = subprocess.run([lambda_python(), "-I", "-S", "-c", code, str(old)], capture_output=True, text=True)
    assert line in found.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel, as `uv build` makes them."""
    out = tmp_path_factory.mktemp("dist")
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or "uv"
    build = [uv, "build", "--quiet", "--sdist", "--wheel", "--out-dir", str(out)]
    result = subprocess.run(build, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    return out


def test_the_sdist_has_the_license_and_no_tests(dist: Path) -> None:
    [sdist] = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = [name.split("/", 1)[1] for name in archive.getnames() if "/" in name]
    assert "LICENSE" in names
    assert [name for name in names if name.startswith(("tests/", "benchmarks/"))] == []


def test_the_wheel_alone_with_local_runs_the_demo_outside_the_repo(dist: Path, tmp_path: Path) -> None:
    [wheel] = dist.glob("*.whl")
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in zipfile.ZipFile(wheel).namelist())
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or "uv"
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True, timeout=120)
    install = [uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), f"{wheel}[local]"]
    subprocess.run(install, check=True, timeout=600)
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    demo = subprocess.run(
        [str(venv / "bin" / "cleanup-worker"), "demo", "--objects", "3"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "0 problems" in demo.stdout


def test_sam_validates_and_builds_the_template(tmp_path: Path) -> None:
    sam = shutil.which("sam")
    if sam is None:
        pytest.skip("aws-sam-cli is not installed (pip install aws-sam-cli to run sam validate --lint and sam build)")
    template = str(ROOT / "deploy" / "template.yaml")
    for command in (["validate", "--lint"], ["build", "--build-dir", str(tmp_path / "build")]):
        result = subprocess.run([sam, *command, "--template-file", template], cwd=ROOT, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
