"""The KCL processor never lets a batch pass uncleaned: a fault at any step ends the process, unacknowledged.

amazon_kclpy's ``KCLProcess`` acknowledges a message whatever its handler raises (it prints the traceback and writes
the status), and a later checkpoint would then pass the records of that batch. Here the processor runs in this
process on amazon_kclpy's own classes, reading the daemon's messages from a scripted stand-in, and one step after
another is made to raise, at its first call, its second, and so on: no checkpoint the daemon accepts, SHARD_END
included, may ever pass a record that is not clean.
"""

from __future__ import annotations

import base64
import importlib
import json
import uuid
from typing import Any

import pytest

from tests.kcl_daemon import SHARD_END, KinesisShard, kinesis_payload
from worker import kcl

INJECTED = "injected fault"
STEPS = [  # (owner, attribute): every step a batch, a checkpoint or a shard end goes through
    ("cleanup.runtime.Runtime", "refresh_mode"),  # the kill switch
    ("worker.kcl", "decode"),
    ("worker.kcl", "InPlaceBatch"),  # e.g. a setting it cannot use
    ("cleanup.streams.retry_in_place", "run_batch"),  # the core
    ("amazon_kclpy.kcl.Checkpointer", "checkpoint"),
    ("worker.health.MessageMarker", "mark"),
]


class ScriptedDaemon:
    """amazon_kclpy's input and output files: hands out ``messages`` one at a time and accepts every checkpoint."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = list(messages)
        self.accepted: list[str] = []  # checkpoints the daemon accepted (SHARD_END for an end-of-shard one)
        self.statuses: list[str] = []  # the messages acknowledged, in order
        self._request: dict[str, Any] | None = None
        self._last_delivered: str | None = None
        self._ending = False

    def readline(self) -> str:
        if self._request is not None:
            request, self._request = self._request, None
            sequence = request["sequenceNumber"] or (SHARD_END if self._ending else self._last_delivered)
            self.accepted.append(sequence)
            reply = {"action": "checkpoint", **{k: request[k] for k in ("sequenceNumber", "subSequenceNumber")}}
            return json.dumps({**reply, "error": None}) + "\n"
        if not self.messages:
            return ""
        message = self.messages.pop(0)
        if message["action"] == "processRecords" and message["records"]:
            self._last_delivered = message["records"][-1]["sequenceNumber"]
        self._ending = message["action"] == "shardEnded"
        return json.dumps(message) + "\n"

    def write(self, text: str) -> None:
        for line in filter(str.strip, text.splitlines()):
            message = json.loads(line)
            if message["action"] == "checkpoint":
                self._request = message
            else:
                self.statuses.append(message["responseFor"])

    def flush(self) -> None:
        pass


class Fault:
    """Makes ``owner.attribute`` raise at its ``at``-th call (and only then)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: str, attribute: str, at: int) -> None:
        self.calls = 0
        self.fired = False
        target = _resolve(owner)
        original = getattr(target, attribute)

        def faulty(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == at:
                self.fired = True
                raise RuntimeError(INJECTED)
            return original(*args, **kwargs)

        monkeypatch.setattr(target, attribute, faulty)


def _resolve(dotted: str) -> Any:
    """A module, or a class in one, by its dotted name."""
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError:
        module, _, name = dotted.rpartition(".")
        return getattr(importlib.import_module(module), name)


def a_shard(stack: Any) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The daemon's messages for a shard of two batches (three deleted sessions) that then ends, and the sessions by
    the sequence number of their REMOVE record."""
    tag = uuid.uuid4().hex[:6]
    shard = KinesisShard()
    batches, removals = [], {}
    for names in ([f"a{tag}", f"b{tag}"], [f"c{tag}"]):
        sessions = {name: stack.put_session(name) for name in names}
        for name in names:
            stack.delete(name)
        records = shard.records(kinesis_payload(record, stack.table) for record in stack.new_records())
        for record in records:
            change = json.loads(base64.b64decode(record["data"]))
            if change["eventName"] == "REMOVE":
                removals[record["sequenceNumber"]] = sessions[change["dynamodb"]["Keys"]["pk"]["S"].split("#")[-1]]
        batches.append({"action": "processRecords", "records": records, "millisBehindLatest": 0})
    start = {"action": "initialize", "shardId": "shardId-000000000000", "sequenceNumber": None, "subSequenceNumber": 0}
    return [start, *batches, {"action": "shardEnded"}], removals


def clean(stack: Any, session: dict[str, Any], grants: set[str]) -> bool:
    return stack.objects(session["scratchPrefix"]) == [] and session["grantId"] not in grants


def run(stack: Any, messages: list[dict[str, Any]]) -> tuple[ScriptedDaemon, int]:
    daemon = ScriptedDaemon(messages)
    runtime = stack.runtime(retry_max_wait_seconds=0.05, max_record_attempts=1)
    try:
        code = kcl.serve(runtime, daemon, daemon)  # type: ignore[arg-type]
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        runtime.close()
    return daemon, code


@pytest.mark.slow  # one shard per step and call: some thirty of them
@pytest.mark.parametrize(("owner", "attribute"), STEPS, ids=[attribute for _, attribute in STEPS])
def test_a_fault_at_any_step_ends_the_processor_and_no_checkpoint_passes_an_uncleaned_record(
    stack, monkeypatch, owner, attribute
):
    at = 0
    while True:
        at += 1
        messages, removals = a_shard(stack)
        with monkeypatch.context() as patch:
            fault = Fault(patch, owner, attribute, at)
            daemon, code = run(stack, messages)
        grants = stack.grant_ids()
        cleaned = {sequence for sequence, session in removals.items() if clean(stack, session, grants)}

        for checkpoint in daemon.accepted:
            passed = set(removals) if checkpoint == SHARD_END else {s for s in removals if int(s) <= int(checkpoint)}
            assert passed <= cleaned, (attribute, at, checkpoint, daemon.accepted)
        if not fault.fired:
            assert (code, daemon.accepted[-1]) == (0, SHARD_END)
            break
        assert code != 0, (attribute, at, daemon.statuses)
        assert len(daemon.statuses) < len(messages), "the message in hand was acknowledged"
    assert at > 1
