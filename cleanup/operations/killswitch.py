"""The kill switch: an AppConfig feature flag that pauses cleanup, or turns it to a dry run, without a redeploy.

The switch is read through the local HTTP endpoint of the AppConfig agent (a container sidecar) or of the AppConfig
Lambda extension, which both serve ``GET {APPCONFIG_AGENT_URL}/applications/{app}/environments/{env}/configurations/
{profile}``. The profile is a feature-flag profile with one flag, ``cleanup``::

    {"cleanup": {"enabled": true, "mode": "enforce"}}     clean (the flag's ``mode`` attribute: enforce or dry-run)
    {"cleanup": {"enabled": true, "mode": "dry-run"}}     plan and log, change nothing
    {"cleanup": {"enabled": false}}                       paused: nothing is read past, nothing is changed

The switch only brakes: the mode in force is the more careful of the flag's and CLEANUP_MODE's (paused, then dry-run,
then enforce), so a deployment made as a dry run is turned to enforce by a deployment, never by a flag alone.

A reading is kept for APPCONFIG_POLL_SECONDS. When the endpoint cannot be read, or answers something that is not
such a flag, the last known mode holds (an operator's pause must not end because the agent restarted); before any
mode is known, CLEANUP_MODE holds, as it does when no profile is configured. Every change of mode is logged once and
counted (``ModeChanges``, dimension ``Mode``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import quote

from cleanup.telemetry import Metrics, log
from schemas.settings import CleanupMode, Settings

FLAG = "cleanup"
AGENT_TIMEOUT_SECONDS = 1.0  # the agent answers from its cache, on this host
MAX_BODY_BYTES = 64 * 1024


class Mode(StrEnum):
    """What the worker does with the records it reads."""

    ENFORCE = "enforce"
    DRY_RUN = "dry-run"
    PAUSED = "paused"


_CARE = {Mode.PAUSED: 0, Mode.DRY_RUN: 1, Mode.ENFORCE: 2}


@dataclass(frozen=True)
class SwitchState:
    """The mode in force and where it comes from (``environment``, ``appconfig`` or ``last-known``)."""

    mode: Mode
    source: str
    flag: Mode | None = None
    error: str | None = None

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


def fetch(url: str) -> bytes:
    """GET the profile from the local agent (at most ``MAX_BODY_BYTES``).

    Raises:
        OSError: the agent could not be reached, or did not answer 200.
    """
    import urllib.request  # only when a switch is configured: it is no cold-start cost otherwise

    with urllib.request.urlopen(url, timeout=AGENT_TIMEOUT_SECONDS) as answer:
        return bytes(answer.read(MAX_BODY_BYTES))


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
        """The mode in force now, reading the flag again if the last reading is older than the poll interval."""
        with self._lock:
            if self._state is None or self._clock() - self._read_at >= self._poll:
                self._read_at = self._clock()
                self._settle(self._read())
            assert self._state is not None
            return self._state

    def mode(self) -> Mode:
        return self.state().mode

    def _read(self) -> SwitchState:
        if self._url is None:
            return SwitchState(self.environment, "environment")
        try:
            self._flag = read_flag(self._get(self._url))
        except (OSError, ValueError) as exc:  # unreachable or unreadable: the last known flag (or the environment)
            known = self._flag
            mode = self.environment if known is None else self._careful(known)
            return SwitchState(mode, "environment" if known is None else "last-known", known, str(exc))
        return SwitchState(self._careful(self._flag), "appconfig", self._flag)

    def _careful(self, flag: Mode) -> Mode:
        return min(flag, self.environment, key=_CARE.__getitem__)

    def _settle(self, state: SwitchState) -> None:
        previous, self._state = self._state, state
        if state.error and (previous is None or previous.error != state.error):
            log.warning("kill switch unreadable; the mode in force holds", extra=state.as_dict())
        if previous is not None and previous.mode is state.mode:
            return
        level = "info" if state.mode is Mode.ENFORCE else "warning"
        getattr(log, level)(f"cleanup mode: {state.mode.value}", extra=state.as_dict())
        self._metrics.count("ModeChanges", "Mode", state.mode.value)
        self._metrics.flush()


def settings_for(settings: Settings, mode: Mode) -> Settings:
    """``settings`` with CLEANUP_MODE set to a mode that cleans or plans (a pause changes nothing here)."""
    if mode is Mode.PAUSED or settings.cleanup_mode.value == mode.value:
        return settings
    return settings.model_copy(update={"cleanup_mode": CleanupMode(mode.value)})
