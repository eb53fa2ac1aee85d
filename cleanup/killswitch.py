"""The kill switch: an AppConfig feature flag that pauses cleanup, or turns it to a dry run, without a redeploy.

The switch is read through the local HTTP endpoint of the AppConfig agent (a container sidecar) or of the AppConfig
Lambda extension, which both serve ``GET {APPCONFIG_AGENT_URL}/applications/{app}/environments/{env}/configurations/
{profile}``. The profile is a feature-flag profile with one flag, ``cleanup``::

    {"cleanup": {"enabled": true, "mode": "enforce"}}     clean (the flag's ``mode`` attribute: enforce or dry-run)
    {"cleanup": {"enabled": true, "mode": "dry-run"}}     plan and log, change nothing
    {"cleanup": {"enabled": false}}                       paused: nothing is read past, nothing is changed

The switch only brakes: the mode in force is the more careful of the flag's and CLEANUP_MODE's (paused, then dry-run,
then enforce), so a deployment made as a dry run is turned to enforce by a deployment, never by a flag alone.

A reading is kept for APPCONFIG_POLL_SECONDS. One reading is one bounded exchange with the endpoint: connecting,
the answer's headers and its body together take at most ``AGENT_TIMEOUT_SECONDS``, however slowly the endpoint
answers. Whatever goes wrong with it (refused, timed out, an error status, a garbled or cut answer, a body that is not
such a flag, whatever the exception) the switch "cannot tell": the last known mode holds (an operator's pause must not
end because the agent restarted). Before any mode is known (a cold start while AppConfig or its agent is down, the
very moment an operator pauses for) the mode is unknown, and unknown holds: ``mode()`` answers ``Mode.PAUSED``, with
``source`` ``unknown``, so every entry point keeps its records as under a pause. Each reading that leaves it unknown is
logged (``kill switch unknown: holding``, once per error) and counted (``SwitchUnknown``), and an unknown switch is
read again at least every ``UNKNOWN_POLL_SECONDS``. Without a profile configured, CLEANUP_MODE decides. Every change
of a mode taken from the flag is logged once and counted (``ModeChanges``, dimension ``Mode``).
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import quote, urlsplit

from cleanup.actions.bounded_http import BoundedSocket
from cleanup.telemetry import Metrics, log
from schemas.settings import CleanupMode, Settings

FLAG = "cleanup"
AGENT_TIMEOUT_SECONDS = 1.0  # one reading, all told: the agent answers from its cache, on this host
MAX_BODY_BYTES = 64 * 1024
UNKNOWN_POLL_SECONDS = 1.0  # an unknown switch is read again this often at least, whatever APPCONFIG_POLL_SECONDS
UNKNOWN = "unknown"


class Mode(StrEnum):
    """What the worker does with the records it reads."""

    ENFORCE = "enforce"
    DRY_RUN = "dry-run"
    PAUSED = "paused"


_CARE = {Mode.PAUSED: 0, Mode.DRY_RUN: 1, Mode.ENFORCE: 2}


@dataclass(frozen=True)
class SwitchState:
    """The mode in force and where it comes from (``environment``, ``appconfig``, ``last-known`` or ``unknown``)."""

    mode: Mode
    source: str
    flag: Mode | None = None
    error: str | None = None

    @property
    def unknown(self) -> bool:
        """Whether the flag was never read: the mode is ``PAUSED`` because nobody can tell what it is."""
        return self.source == UNKNOWN

    def as_dict(self) -> dict[str, str | None]:
        return {
            "mode": self.mode.value,
            "source": self.source,
            "flag": self.flag and self.flag.value,
            "error": self.error,
        }


def read_flag(body: bytes) -> Mode:
    """The mode a feature-flag profile's body asks for.

    Raises:
        ValueError: the body is not JSON, or has no ``cleanup`` flag of the documented shape.
    """
    flag = json.loads(body).get(FLAG) if body.strip().startswith(b"{") else None
    if not isinstance(flag, dict) or not isinstance(flag.get("enabled"), bool):
        raise ValueError(f'the profile has no "{FLAG}" flag with a boolean "enabled"')
    if not flag["enabled"]:
        return Mode.PAUSED
    mode = flag.get("mode", Mode.ENFORCE.value)
    if mode not in (Mode.ENFORCE.value, Mode.DRY_RUN.value):
        raise ValueError(f'the "{FLAG}" flag\'s mode must be enforce or dry-run, not {mode!r}')
    return Mode(mode)


def agent_url(settings: Settings) -> str | None:
    """The profile's URL on the local agent, or None when no switch is configured."""
    if settings.kill_switch is None:
        return None
    app, env, profile = (quote(name, safe="") for name in settings.kill_switch)
    return f"{settings.appconfig_agent_url}/applications/{app}/environments/{env}/configurations/{profile}"


def fetch(url: str, timeout: float = AGENT_TIMEOUT_SECONDS) -> bytes:
    """GET the profile from the local agent: the whole exchange within ``timeout`` seconds, the body whole and at most
    ``MAX_BODY_BYTES``.

    Raises:
        OSError: the agent could not be reached, or did not answer in time, or not 200.
        http.client.HTTPException: the answer is not well-formed HTTP, or its body is cut.
        ValueError: the body is larger than ``MAX_BODY_BYTES``.
    """
    parts = urlsplit(url)
    deadline = time.monotonic() + timeout
    request = f"GET {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n"
    with socket.create_connection((parts.hostname or "localhost", parts.port or 80), timeout=timeout) as sock:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        sock.sendall(request.encode("ascii"))
        answer = http.client.HTTPResponse(BoundedSocket(sock, deadline), method="GET")  # type: ignore[arg-type]
        answer.begin()
        if answer.status != 200:
            raise OSError(f"the agent answered {answer.status} {answer.reason}")
        body = answer.read(MAX_BODY_BYTES + 1)
        if len(body) > MAX_BODY_BYTES:
            raise ValueError(f"the profile is larger than {MAX_BODY_BYTES} bytes")
        if answer.length:  # read(n) returns a body cut short of its Content-Length as it is: it is not the flag
            raise http.client.IncompleteRead(body, answer.length)
        return bytes(body)


class KillSwitch:
    """The mode in force for one process: read between batches, kept for APPCONFIG_POLL_SECONDS."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        *,
        get: Callable[[str], bytes] = fetch,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.environment = Mode(settings.cleanup_mode.value)
        self._url = agent_url(settings)
        self._poll = settings.appconfig_poll_seconds
        self._metrics = metrics
        self._get = get
        self._clock = clock
        self._lock = threading.Lock()
        self._flag: Mode | None = None
        self._state: SwitchState | None = None
        self._read_at = float("-inf")

    @property
    def configured(self) -> bool:
        return self._url is not None

    def state(self) -> SwitchState:
        """The mode in force now, reading the flag again if the last reading is older than the poll interval (or, while
        the switch is unknown, than ``UNKNOWN_POLL_SECONDS``)."""
        with self._lock:
            if self._state is None or self._clock() - self._read_at >= self._keep(self._state):
                self._read_at = self._clock()
                self._settle(self._read())
            assert self._state is not None
            return self._state

    @property
    def unknown(self) -> bool:
        """Whether the last reading left the switch unknown (never read successfully); reads nothing."""
        return self._state is not None and self._state.unknown

    def mode(self) -> Mode:
        """The mode in force (``Mode.PAUSED`` while the switch is unknown: see the module's docstring)."""
        return self.state().mode

    def _keep(self, state: SwitchState) -> float:
        return min(self._poll, UNKNOWN_POLL_SECONDS) if state.unknown else self._poll

    def _read(self) -> SwitchState:
        if self._url is None:
            return SwitchState(self.environment, "environment")
        try:
            self._flag = read_flag(self._get(self._url))
        except Exception as exc:  # any failure of the reading, whatever its type, is "cannot tell": an agent's
            # garbled answer must neither stop the worker nor count as a flag
            known = self._flag
            if known is None:
                return SwitchState(Mode.PAUSED, UNKNOWN, None, _describe(exc))
            return SwitchState(self._careful(known), "last-known", known, _describe(exc))
        return SwitchState(self._careful(self._flag), "appconfig", self._flag)

    def _careful(self, flag: Mode) -> Mode:
        return min(flag, self.environment, key=_CARE.__getitem__)

    def _settle(self, state: SwitchState) -> None:
        previous, self._state = self._state, state
        if state.unknown:
            if previous is None or previous.error != state.error:
                log.warning("kill switch unknown: holding", extra=state.as_dict())
            self._metrics.count("SwitchUnknown")
            self._metrics.flush()
            return
        if state.error and (previous is None or previous.error != state.error):
            log.warning("kill switch unreadable; the mode in force holds", extra=state.as_dict())
        if previous is not None and not previous.unknown and previous.mode is state.mode:
            return
        level = "info" if state.mode is Mode.ENFORCE else "warning"
        getattr(log, level)(f"cleanup mode: {state.mode.value}", extra=state.as_dict())
        self._metrics.count("ModeChanges", "Mode", state.mode.value)
        self._metrics.flush()


def _describe(exc: BaseException) -> str:
    """The error of a reading in one short line (an ``http.client`` error may carry the whole garbled line)."""
    return f"{type(exc).__name__}: {exc}"[:300]


def settings_for(settings: Settings, mode: Mode) -> Settings:
    """``settings`` with CLEANUP_MODE set to a mode that cleans or plans (a pause changes nothing here)."""
    if mode is Mode.PAUSED or settings.cleanup_mode.value == mode.value:
        return settings
    return settings.model_copy(update={"cleanup_mode": CleanupMode(mode.value)})
