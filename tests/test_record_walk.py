"""The record's walk: from the Lambda handler to its first destructive call, how often the record comes back to the
pipeline (``cleanup/core/pipeline.py``). The pipeline hands a record to its stages (classify, plan and act, the
actions behind the fence) and they do not call back into it: a structural check, not a timing one.

The walk is traced with a profile hook in every thread, over the modules of the record's stages (the Lambda handler,
``cleanup/core/`` and ``cleanup/actions/``); the AWS edge, the queues, the runtime, logging and the schemas the
stages use are passed through. A return to the pipeline is a step from another of those modules into a pipeline
frame (the call that first enters it is not a return).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from tests.stack import SessionStack
from worker import lambda_handler

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("worker/lambda_handler.py", "cleanup/core/", "cleanup/actions/")
PIPELINE = "cleanup/core/pipeline.py"
DESTRUCTIVE = {"DeleteConnection", "RetireGrant", "RevokeGrant", "DeleteObjects", "DeleteObject", "BatchWriteItem"}
MOST_RETURNS = 4


class Walk:
    """Each thread's steps between stage modules, until the first destructive call of any thread."""

    def __init__(self) -> None:
        self.steps: dict[int, list[str]] = {}
        self.destructive: str | None = None
        self._modules: dict[str, str | None] = {}

    def _module(self, frame: FrameType | None) -> str | None:
        """The stage module of the innermost stage frame at or under ``frame``."""
        while frame is not None:
            name = frame.f_code.co_filename
            if name not in self._modules:
                try:
                    relative = Path(name).resolve().relative_to(ROOT).as_posix()
                except ValueError:
                    relative = ""
                self._modules[name] = relative if relative.startswith(STAGES) else None
            if self._modules[name] is not None:
                return self._modules[name]
            frame = frame.f_back
        return None

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.destructive is not None or event not in ("call", "return"):
            return
        if event == "call" and frame.f_code.co_name == "_make_api_call":
            operation = frame.f_locals.get("operation_name")
            if operation in DESTRUCTIVE:
                self.destructive = str(operation)
                return
        module = self._module(frame if event == "call" else frame.f_back)
        steps = self.steps.setdefault(threading.get_ident(), [])
        if module is not None and (not steps or steps[-1] != module):
            steps.append(module)


@contextmanager
def traced(walk: Walk) -> Iterator[Walk]:
    sys.setprofile(walk)
    threading.setprofile(walk)
    try:
        yield walk
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def test_a_record_returns_to_the_pipeline_at_most_four_times_before_its_first_destructive_call(
    stack: SessionStack,
) -> None:
    item = stack.put_session("walk")
    stack.delete("walk")
    event = stack.lambda_event()
    event["Records"] = [record for record in event["Records"] if record["eventName"] == "REMOVE"]
    runtime = stack.runtime()

    with lambda_handler.warm.use(runtime), traced(Walk()) as walk:
        answer = lambda_handler.handler(event, None)

    assert answer == {"batchItemFailures": []}
    assert stack.objects(item["scratchPrefix"]) == [] and item["grantId"] not in stack.grant_ids()
    assert walk.destructive is not None
    [main] = [steps for steps in walk.steps.values() if steps[:1] == ["worker/lambda_handler.py"]]
    returns = [n for n, module in enumerate(main) if module == PIPELINE][1:]
    assert len(returns) <= MOST_RETURNS, " -> ".join(main)
