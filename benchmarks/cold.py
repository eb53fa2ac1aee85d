"""Cold start and memory: each case is a fresh interpreter (``benchmarks.invoke``), so its peak RSS is its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from benchmarks.world import World


def invoke(env: dict[str, str], event: dict[str, Any], *, stub: bool = False) -> dict[str, Any]:
    """Run one cold invocation in a child interpreter and return its report."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as spec:
        json.dump({"env": env, "event": event, "stub": stub}, spec)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.invoke", spec.name], capture_output=True, text=True, check=True
        )
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"invocation failed: {exc.stderr[-2000:]}") from exc
    finally:
        os.unlink(spec.name)
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if report["failures"]:
        raise AssertionError(f"cold invocation reported {report['failures']} failures")
    return report


def lambda_env(batch: dict[str, Any], aws: str, callback: str) -> dict[str, str]:
    """The environment a deployed function would have, pointed at ``aws`` and ``callback``."""
    return {
        "AWS_ENDPOINT_URL": aws,
        "SCRATCH_BUCKET": batch["bucket"],
        "KMS_KEY_ID": batch["key_arn"],
        "SESSION_TABLE": batch["table"],
        "WS_CALLBACK_URL": callback,
        "METRICS_DESTINATION": "off",
        "LOG_LEVEL": "WARNING",
    }


def import_time() -> dict[str, Any]:
    """``python -X importtime -c "import worker.lambda_handler"``: the total, and the heaviest packages (each one's
    largest cumulative time, wherever it was first imported)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import worker.lambda_handler"],
        capture_output=True,
        text=True,
        check=True,
    )
    total, packages = 0, dict[str, int]()
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cumulative_us, name = (part.strip() for part in line[len("import time:") :].split("|"))
        total += int(self_us)
        package = name.split(".")[0]
        packages[package] = max(packages.get(package, 0), int(cumulative_us))
    ours = ("worker", "cleanup", "schemas")
    heaviest = sorted((p for p in packages if p not in ours), key=packages.__getitem__, reverse=True)[:6]
    return {"total_seconds": total / 1e6, "heaviest": [(name, packages[name] / 1e6) for name in heaviest]}


def first_record(world: World) -> dict[str, Any]:
    """A cold process cleaning one session through the latency proxy: time from process start to its answer."""
    batch = world.populate(1)
    report = invoke(lambda_env(batch, world.endpoints["aws_proxy"], world.endpoints["gateway_proxy"]), batch["event"])
    if any(world.observe(batch).values()):
        raise AssertionError("the cold invocation left the session's resources behind")
    return report


def prefix_memory(world: World, objects: int) -> dict[str, Any]:
    """Peak RSS of a cold process deleting one prefix of ``objects`` objects (moto, no proxy)."""
    batch = world.populate(1, objects=objects, grant=False, sockets=False)
    report = invoke(lambda_env(batch, world.endpoints["aws"], world.endpoints["gateway"]), batch["event"])
    if world.observe(batch)["objects"]:
        raise AssertionError(f"objects left after deleting a prefix of {objects}")
    return report


def batch_memory(world: World, records: int) -> dict[str, Any]:
    """Peak RSS of a cold process cleaning a batch of ``records`` sessions, AWS answered in-process.

    The batch is one real REMOVE record from moto's stream, cloned with distinct keys and sequence numbers.
    """
    batch = world.populate(1, objects=0, sockets=False)
    template = json.dumps(batch["event"]["Records"][0])
    clones = []
    for n in range(records):
        record = json.loads(template)
        change = record["dynamodb"]
        change["SequenceNumber"] = f"{10**20 + n:021d}"
        for image in (change["Keys"], change["OldImage"]):
            image["pk"] = {"S": f"session#clone-{n}"}
        change["OldImage"]["scratchPrefix"] = {"S": f"sessions/t{n % 7}/clone-{n}/"}
        change["OldImage"]["connectionId"] = {"S": f"C{n:014d}="}
        clones.append(record)
    # The clones share one grant, named after the one session they were cloned from: no binding to check here.
    env = {**lambda_env(batch, world.endpoints["aws"], world.endpoints["gateway"]), "SESSION_BINDING": "false"}
    return invoke(env, {"Records": clones}, stub=True)
