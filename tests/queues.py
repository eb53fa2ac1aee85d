"""Queues as the redrive tests use them: put messages on, look at what is left, run the ``redrive`` command."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.stack import client
from worker import cli


def send(queue: str, *bodies: str) -> None:
    for body in bodies:
        client("sqs").send_message(QueueUrl=queue, MessageBody=body)


def on_queue(queue: str) -> list[str]:
    """The bodies of the messages on ``queue``, left there (visible again at once)."""
    answer = client("sqs").receive_message(QueueUrl=queue, MaxNumberOfMessages=10, VisibilityTimeout=0)
    return [m["Body"] for m in answer.get("Messages", [])]


def redrive(capsys: pytest.CaptureFixture[str], queue: str) -> tuple[int, dict[str, Any]]:
    """``cleanup-worker redrive --json`` on ``queue``: its exit code and its report."""
    code = cli.main(["redrive", "--queue-url", queue, "--wait-seconds", "0", "--json"])
    return code, json.loads(capsys.readouterr().out)
