"""A scripted scheduler for one session's cleanup: between any two AWS calls the session may be re-created, and any
call may fail or be answered with garbage; every call is logged, so that the fence's invariant can be checked.

The worker's runtime is given ``ScriptedClients``: every client it makes (DynamoDB, S3, KMS, the management API) has
three hooks, after the worker's own pacing and the permit asked where a freeing call leaves, so botocore's own retry
path still runs:

* ``before-parameter-build``: the call's own parameters, and its number in the script; when the script says so, the
  session's item is written again under its key (re-created) before this call goes out;
* ``before-send``: a fault the script holds for this call (a 500, a throttle, or a 200 with a garbled body) is
  answered in place of the service, so nothing reaches it; otherwise the attempt is logged as sent;
* ``after-call``: a clean BatchGetItem answer is logged as a read, with the item the answer itself carried under the
  session table (the session may have been re-created on another thread since the table answered: what the script
  holds now says nothing about what this answer said).

``violations`` checks the rule against the log: every destructive attempt that reached a service was preceded by a
clean read, taken after the previous destructive attempt, whose item did not hold what the attempt destroys.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from boto3.dynamodb.types import TypeDeserializer
from botocore.awsrequest import AWSResponse

from cleanup.aws.clients import Clients
from schemas.settings import Settings
from tests.faults import RawBody

EMPTY_SUCCESS = {"DeleteConnection", "RetireGrant", "DeleteObject", "DeleteItem"}
DESTRUCTIVE = {"DeleteConnection", "RetireGrant", "DeleteObjects", "DeleteObject", "BatchWriteItem", "DeleteItem"}
WAITED_AT_MOST = 0.4
"""The longest a destructive attempt may follow the read that allowed it: the permit's bound (0.25 s) and room for
a loaded machine. A read taken before a wait for a turn (half a second at the scripts' paced rate) is later than
this."""
FAULTS = ("500", "throttle", "garbled")
SCRIPTED = "scripted_call"
GARBLED = {  # 200 answers botocore parses without complaint, and which say nothing about the item
    "dynamodb": (b"{}", "application/x-amz-json-1.0"),
    "s3": (b"", "application/xml"),
    "kms": (b"{}", "application/x-amz-json-1.1"),
    "apigatewaymanagementapi": (b"", "application/json"),
}


@dataclass
class Event:
    """One logged moment: a read answered cleanly (``live``: the item the table held), or a destructive attempt
    that reached the service (``what``: the operation, ``params``: its parameters)."""

    kind: str
    what: str
    live: dict[str, Any] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    at: float = field(default_factory=time.monotonic)


@dataclass
class Script:
    """What happens during one cleanup: ``recreate_at`` (the call before which the session comes back as
    ``recreated``), and ``faults`` (call number -> one of FAULTS)."""

    recreate_at: int | None = None
    recreated: dict[str, Any] | None = None
    faults: dict[int, str] = field(default_factory=dict)


class ScriptedClients(Clients):
    """The runtime's clients, each hooked to play ``script`` and log what happened (see the module's docstring)."""

    def __init__(self, settings: Settings, script: Script, live: dict[str, Any] | None, put: Any) -> None:
        super().__init__(settings)
        self.script = script
        self.live = live
        self.log: list[Event] = []
        self._put = put
        self._lock = threading.RLock()
        self._calls = 0

    def _create(self, service: str, endpoint_url: str | None, region: str | None = None) -> Any:
        client = super()._create(service, endpoint_url, region)
        client.meta.events.register("before-parameter-build", self._begin)
        client.meta.events.register("before-send", self._send)
        client.meta.events.register("after-call", self._answered)
        return client

    def _begin(self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        with self._lock:
            number, self._calls = self._calls, self._calls + 1
            # In the request's own context: a freeing call's permit reads the live item (a call of its own, on the
            # same thread) from inside its send.
            context[SCRIPTED] = (number, model.name, dict(params))
            if number == self.script.recreate_at and self.script.recreated is not None:
                self.live = self.script.recreated
                self._put(self.live)

    def _send(self, request: Any, event_name: str, **_: Any) -> AWSResponse | None:
        number, operation, params = request.context[SCRIPTED]
        fault = self.script.faults.pop(number, None)  # once: botocore's next attempt of the call goes through
        if fault == "garbled" and operation in EMPTY_SUCCESS:
            fault = "500"  # their success is an empty body: a garbled one cannot be told from it, nor is it one
        if fault is not None:
            return _fault(fault, event_name.split(".")[1], request.url)
        if operation in DESTRUCTIVE:
            with self._lock:
                self.log.append(Event("destroy", operation, params=params))
        return None

    def _answered(self, http_response: Any, parsed: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name != "BatchGetItem" or http_response.status_code != 200:
            return
        table = str(self._settings.session_table)
        if table not in parsed.get("Responses", {}) or parsed.get("UnprocessedKeys"):
            return  # not a clean answer for the session's key: the fence cannot read it as one either
        items = [_plain(item) for item in parsed["Responses"][table]]
        with self._lock:
            self.log.append(Event("read", "BatchGetItem", live=items[0] if items else None))


def _plain(item: dict[str, Any]) -> dict[str, Any]:
    deserializer = TypeDeserializer()
    return {name: deserializer.deserialize(value) for name, value in item.items()}


def _fault(kind: str, service: str, url: str) -> AWSResponse:
    if kind == "garbled":
        body, content_type = GARBLED.get(service, (b"{}", "application/json"))
        return AWSResponse(url, 200, {"Content-Type": content_type}, RawBody(body))
    code, status = ("ThrottlingException", 400) if kind == "throttle" else ("InternalServerError", 500)
    body = json.dumps({"__type": code, "message": "scripted"}).encode()
    headers = {"x-amzn-ErrorType": code, "Content-Type": "application/x-amz-json-1.0"}
    return AWSResponse(url, status, headers, RawBody(body))


ACTION_OF = {
    "DeleteConnection": "connection",
    "RetireGrant": "grant",
    "DeleteObjects": "scratch",
    "DeleteObject": "scratch",
    "BatchWriteItem": "registry",
    "DeleteItem": "tokens",
}


class FenceLog(logging.Handler):
    """Adds the fence's own DEBUG lines (``fence read``, ``fence permit``) to ``clients.log``, in order with the
    calls: which reading allowed which call."""

    def __init__(self, clients: ScriptedClients) -> None:
        super().__init__(logging.DEBUG)
        self.clients = clients

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message not in ("fence read", "fence permit"):
            return
        number = int(getattr(record, "fenceReading", 0))
        with self.clients._lock:
            if message == "fence read":
                self.clients.log.append(Event("fence-read", str(number)))
            else:
                self.clients.log.append(Event("permit", str(getattr(record, "action", "")), params={"reading": number}))


def violations(log: list[Event]) -> list[str]:
    """Every destructive attempt that the rule does not allow, described: one with no permit of its action since
    the last; one whose permit's reading came before a destructive call made in between; one destroying what the
    live item held at that reading."""
    found: list[str] = []
    clean: Event | None = None  # the latest clean BatchGetItem answer
    states: dict[int, dict[str, Any] | None] = {}
    read_at: dict[int, int] = {}
    answered: dict[int, float] = {}
    permits: dict[str, tuple[int, int]] = {}
    destroyed_at: list[int] = []
    for position, event in enumerate(log):
        if event.kind == "read":
            clean = event
        elif event.kind == "fence-read":
            number = int(event.what)
            states[number], read_at[number] = (clean.live if clean else None), position
            answered[number] = clean.at if clean else event.at
        elif event.kind == "permit":
            permits[event.what] = (position, int(event.params["reading"]))
        elif event.kind == "destroy":
            permit = permits.pop(ACTION_OF[event.what], None)
            found += _judge(event, permit, states, read_at, destroyed_at)
            if permit is not None and permit[1] in answered and event.at - answered[permit[1]] > WAITED_AT_MOST:
                waited = event.at - answered[permit[1]]
                found.append(f"{event.what} {event.params} sent {waited:.2f} s after the read that allowed it")
            destroyed_at.append(position)
    return found


def _judge(
    event: Event,
    permit: tuple[int, int] | None,
    states: dict[int, dict[str, Any] | None],
    read_at: dict[int, int],
    destroyed_at: list[int],
) -> list[str]:
    if permit is None:
        return [f"{event.what} {event.params} with no permit since the previous one"]
    position, number = permit
    if number not in states:
        return [f"{event.what} {event.params} allowed by reading #{number}, which no clean answer carried"]
    if any(read_at[number] < destroyed < position for destroyed in destroyed_at):
        return [f"{event.what} {event.params} allowed by reading #{number}, older than a destructive call since"]
    if _held(states[number], event):
        return [f"{event.what} {event.params} destroys what the live item held: {states[number]}"]
    return []


def _held(live: dict[str, Any] | None, event: Event) -> bool:
    if live is None:
        return False
    params = event.params
    if event.what == "DeleteConnection":
        return bool(params.get("ConnectionId") == live.get("connectionId"))
    if event.what == "RetireGrant":
        return bool(params.get("GrantId") == live.get("grantId"))
    prefix = str(live.get("scratchPrefix", ""))
    if event.what == "DeleteObjects":
        return any(str(entry["Key"]).startswith(prefix) for entry in params["Delete"]["Objects"])
    if event.what == "DeleteObject":
        return str(params["Key"]).startswith(prefix)
    if event.what == "DeleteItem":
        return bool(params.get("Key", {}).get("pk") == {"S": f"token#{live.get('tokenId')}"})
    return event.what == "BatchWriteItem" and live.get("connectionId") is not None
