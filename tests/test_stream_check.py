"""The Lambda deployment follows a stream change, or says so at once: the scheduled stream check compares the
mapping's stream with the table's LatestStreamArn and publishes ``StreamChanged`` (the template's
``StreamChangedAlarm``). Against moto over HTTP: a function and its mapping (moto keeps them, and polls nothing; no
write follows the mapping's creation), the table's stream changed in moto's own backend."""

from __future__ import annotations

import io
import zipfile
from typing import Any

import pytest

from cleanup.exceptions import CleanupError
from tests.stack import client
from tests.test_poller_stream import re_enable
from tests.test_sweep import CapturedMetrics


def mapping_on(stack: Any, stream_arn: str) -> str:
    """A function with an event source mapping on ``stream_arn``: the mapping's UUID."""
    iam, functions = client("iam"), client("lambda")
    role = iam.create_role(
        RoleName=f"cleanup-{stack.table}",
        AssumeRolePolicyDocument='{"Version": "2012-10-17", "Statement": []}',
    )["Role"]["Arn"]
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as archive:
        archive.writestr("handler.py", "def handler(event, context):\n    return {}\n")
    function = functions.create_function(
        FunctionName=f"cleanup-{stack.table}",
        Runtime="python3.12",
        Role=role,
        Handler="handler.handler",
        Code={"ZipFile": code.getvalue()},
    )
    mapping = functions.create_event_source_mapping(
        EventSourceArn=stream_arn, FunctionName=function["FunctionArn"], StartingPosition="TRIM_HORIZON"
    )
    return str(mapping["UUID"])


def check(stack: Any, uuid: str, sink: CapturedMetrics) -> dict[str, Any]:
    from worker import stream_check

    runtime = stack.runtime(event_source_mapping_uuid=uuid)
    runtime.metrics.sink = sink
    with stream_check.warm.use(runtime):
        result: dict[str, Any] = stream_check.handler({}, None)
    return result


def test_the_check_says_nothing_changed_while_the_mapping_reads_the_tables_latest_stream(stack):
    uuid = mapping_on(stack, stack.stream_arn)
    sink = CapturedMetrics()

    result = check(stack, uuid, sink)

    assert result["streamChanged"] is False
    assert sink.values("StreamChanged") == [0]


def test_the_check_alarms_once_the_table_names_another_stream_than_the_mapping(stack, caplog):
    uuid = mapping_on(stack, stack.stream_arn)
    new = re_enable(stack)  # the view type changed: the table's stream is a new one, the mapping stays on the old
    sink = CapturedMetrics()

    result = check(stack, uuid, sink)

    assert result["streamChanged"] is True
    assert (result["mappedStream"], result["latestStream"]) == (stack.stream_arn, new)
    assert sink.values("StreamChanged") == [1]
    [error] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert "A stream change" in error.getMessage()


def test_a_mapping_that_cannot_be_read_fails_the_check_instead_of_passing_it(stack):
    with pytest.raises(CleanupError):  # unknown is not "the same stream": the invocation fails, the alarm counts it
        check(stack, "00000000-0000-0000-0000-000000000000", CapturedMetrics())
