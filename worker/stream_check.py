"""The scheduled Lambda ``worker.stream_check.handler``: does the stream mapping read the session table's latest
stream?

A table's stream is replaced when its view type changes or the table is re-created; an event source mapping keeps
reading the stream it was created on, and a function that is never invoked emits no errors and no iterator age, so
no other alarm fires. Every 15 minutes the check compares the mapping's ``EventSourceArn`` (GetEventSourceMapping of
EVENT_SOURCE_MAPPING_UUID) with the table's ``LatestStreamArn`` (DescribeTable of SESSION_TABLE) and emits
``StreamChanged``: 1 when they differ (``StreamChangedAlarm``), with an ERROR naming both streams and what to do
(docs/lambda.md, "A stream change"), 0 when they are the same. A mapping that is not enabled is said in a WARNING
(the canary, where enabled, alarms on it). An answer it cannot read is an error of the invocation, which the alarm
counts too: unknown is no "same stream".
"""

from __future__ import annotations

from typing import Any

from cleanup.aws.calls import call
from cleanup.exceptions import MissingConfigError, TransientError
from cleanup.runtime import WarmRuntime
from cleanup.streams.discovery import table_stream
from cleanup.telemetry import log

warm = WarmRuntime()
"""The runtime kept between invocations (``warm.use(runtime)`` hands the handler another)."""
ENABLED_STATES = frozenset({"Enabled", "Enabling", "Updating"})


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Compare the mapping's stream with the table's latest; publish ``StreamChanged``.

    Raises:
        MissingConfigError: SESSION_TABLE or EVENT_SOURCE_MAPPING_UUID is not set.
        TransientError / PermanentError: the mapping or the table could not be read (the invocation fails).
    """
    runtime = warm.get()
    settings = runtime.settings
    if not settings.session_table or not settings.event_source_mapping_uuid:
        raise MissingConfigError("the stream check needs SESSION_TABLE and EVENT_SOURCE_MAPPING_UUID")
    mapping = call(
        runtime.clients.get("lambda").get_event_source_mapping,
        "GetEventSourceMapping",
        None,
        UUID=settings.event_source_mapping_uuid,
    )
    mapped, state = mapping.get("EventSourceArn"), mapping.get("State")
    if not isinstance(mapped, str) or not mapped:
        raise TransientError("GetEventSourceMapping: the answer names no EventSourceArn")
    latest, _enabled = table_stream(runtime.clients.dynamodb, settings.session_table)
    changed = mapped != latest
    extra = {"table": settings.session_table, "mappedStream": mapped, "latestStream": latest, "mappingState": state}
    if changed:
        log.error(
            "the stream mapping reads another stream than the table's latest: nothing cleans the new stream's "
            "sessions; move the mapping (docs/lambda.md, 'A stream change')",
            extra=extra,
        )
    elif state not in ENABLED_STATES:
        log.warning("the stream mapping is not enabled: nothing is cleaned", extra=extra)
    runtime.metrics.count("StreamChanged", amount=int(changed))
    runtime.metrics.flush()
    return {"streamChanged": changed, **extra}
