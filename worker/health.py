"""``cleanup-worker health``: exit 0 while the worker in this container makes progress, 1 when it does not.

Made for a Dockerfile ``HEALTHCHECK`` (no curl, no port, nothing but the files the worker writes); the one line it
prints says why, and the orchestrator keeps it (``docker inspect``).

* The stream poller (``cleanup-worker run``) touches HEALTH_FILE each time its loop comes round: healthy while the
  file is younger than HEALTH_STALE_SECONDS. The file is removed when the poller stops. A poller whose stream has
  ended (disabled, or gone) with no new stream to follow is unhealthy, whatever its pulse: it cleans nothing
  (``<HEALTH_FILE>.stream`` says why).
* Either consumer's oldest waiting record (``cleanup.streams.record_age``: ``<HEALTH_FILE>.age``, or the KCL
  processor's marker): past half the stream's retention (12 h of a DynamoDB stream's 24) the answer is still healthy
  with a warning; four hours before the retention runs out (20 h) it is unhealthy, paused or not: the records are
  about to be lost.
* The KCL image (``--kcl``): the MultiLangDaemon (java) is running, and every record processor holding one of its
  messages is either working towards a verdict on its records (cleaned, or given up at a known moment) or paused
  by the kill switch; not one that has not come round for HEALTH_STALE_SECONDS (wedged), nor one stuck on a record
  given up with nowhere to go. Each processor marks the message it works on in ``<HEALTH_FILE>.kcl-<pid>``
  (``MessageMarker``): written when the message arrives and each time the processor comes round (an attempt, a
  slice of a wait, a checkpoint, a look at the switch), with its state; removed when the message is answered. An idle
  processor, or a worker holding no shard, has no marker and is healthy. The line printed names each state.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cleanup.exceptions import ConfigurationError
from cleanup.streams.record_age import describe, read_age_file, verdict
from cleanup.streams.stream_state import stream_problem
from schemas.settings import Settings, configuration_problems
from worker.exit_codes import ExitCode

DAEMON_CLASS = "software.amazon.kinesis.multilang.MultiLangDaemon"
PROC = Path("/proc")
PROGRESSING = "progressing"
"""Working towards a verdict on every record in hand: each is cleaned, or given up at a known moment."""
PAUSED = "paused"
"""Holding its message on the kill switch's word: healthy (a restart would only pause again, with a cold switch)."""
STUCK = "stuck"
"""Holding a record given up with nowhere to hand it (no dead-letter queue): the shard waits until someone acts."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``health`` sub-command's options; the file and the bound come from the environment, as the worker's do."""
    parser.add_argument("--kcl", action="store_true", help="check the KCL daemon and its record processors")
    parser.add_argument(
        "--daemon-pid", type=int, help="with --kcl: the MultiLangDaemon's process id (default: any process running it)"
    )


def main(args: argparse.Namespace) -> int:
    """Print ``healthy`` and return 0, or ``unhealthy: <why>`` and return 1 (also for invalid settings: a health
    check answers 0 or 1 only)."""
    try:
        settings = Settings()
    except ValidationError as exc:
        return _unhealthy(str(ConfigurationError(configuration_problems(exc))))
    notes: list[str] = []
    problem = kcl_problem(settings, args.daemon_pid, notes) if args.kcl else poller_problem(settings, notes)
    if problem is not None:
        return _unhealthy(problem)
    print("; ".join(["healthy", *notes]))
    return ExitCode.OK


def _unhealthy(problem: str) -> int:
    print(f"unhealthy: {problem}")
    return ExitCode.FAILED


def poller_problem(settings: Settings, notes: list[str] | None = None) -> str | None:
    """Why the stream poller is not healthy, or None (a warning then added to ``notes``): first a stream it cannot
    consume (disabled, or gone), then its loop's pulse, then the age of its oldest waiting record."""
    stream = stream_problem(settings.health_file)
    if stream is not None:
        return stream
    path = Path(settings.health_file)
    try:
        age = _age(path)
    except FileNotFoundError:
        return f"no {path}: the poller is not running (or not started yet)"
    except OSError as exc:
        return f"cannot read {path}: {exc}"
    if age >= settings.stale_after:
        return f"the poll loop last came round {age:.0f} s ago (HEALTH_STALE_SECONDS: {settings.stale_after:g})"
    waiting = read_age_file(settings.health_file)
    return None if waiting is None else age_problem("the poller", *waiting, notes)


def age_problem(who: str, age: float, retention_seconds: float, notes: list[str] | None) -> str | None:
    """Unhealthy past the critical age of a waiting record; a note past the warning age."""
    level = verdict(age, retention_seconds)
    if level == "critical":
        return f"{who}: {describe(age, retention_seconds)}"
    if level == "warning" and notes is not None:
        notes.append(f"warning: {who}: {describe(age, retention_seconds)}")
    return None


def kcl_problem(settings: Settings, daemon_pid: int | None, notes: list[str] | None = None) -> str | None:
    """Why the KCL daemon or one of its record processors is not healthy, or None (each working processor's state
    then added to ``notes``).

    A processor is unhealthy when it has not come round for HEALTH_STALE_SECONDS (wedged), when it is stuck, or when
    a record it retries is past its give-up moment by as long (a verdict overdue). One that retries records towards
    their give-up moment, or that the kill switch pauses, is healthy.
    """
    if not daemon_running(daemon_pid):
        return f"the KCL MultiLangDaemon is not running ({DAEMON_CLASS})"
    for pid, path in markers(settings.health_file):
        try:
            age, marker = _age(path), _read_marker(path)
        except OSError:
            continue  # answered (removed) while we looked
        if not _alive(pid):
            continue
        problem = _processor_problem(pid, age, marker, settings.stale_after)
        if problem is not None:
            return problem
        if notes is not None:
            notes.append(_processor_note(pid, marker))
        waiting = _waiting(marker)
        problem = None if waiting is None else age_problem(f"record processor {pid}", *waiting, notes)
        if problem is not None:
            return problem
    return None


def _waiting(marker: dict[str, Any]) -> tuple[float, float] | None:
    """The age of the oldest record a processor's marker says waits, and the stream's retention."""
    oldest, retention = marker.get("oldestRecordAt"), marker.get("retentionSeconds")
    if not isinstance(oldest, int | float) or not isinstance(retention, int | float):
        return None
    return max(0.0, time.time() - oldest), float(retention)


def _processor_problem(pid: int, age: float, marker: dict[str, Any], stale_after: float) -> str | None:
    if age >= stale_after:
        return f"record processor {pid} has not come round for {age:.0f} s (HEALTH_STALE_SECONDS: {stale_after:g})"
    if marker.get("state") == STUCK:
        records = ", ".join(marker.get("records", []))
        return f"record processor {pid} is stuck on {records}: given up, with no DEAD_LETTER_QUEUE_URL to take it"
    give_up_at = marker.get("giveUpAt")
    if isinstance(give_up_at, int | float) and time.time() - give_up_at >= stale_after:
        overdue = time.time() - give_up_at
        return f"record processor {pid}: a record due to be given up {overdue:.0f} s ago is still held"
    return None


def _processor_note(pid: int, marker: dict[str, Any]) -> str:
    if marker.get("state") == PAUSED:
        return f"record processor {pid} paused by the kill switch"
    give_up_at = marker.get("giveUpAt")
    if isinstance(give_up_at, int | float):
        due = max(0.0, give_up_at - time.time())
        return f"record processor {pid} retrying {marker.get('failing', 1)} record(s), given up in {due:.0f} s at most"
    return f"record processor {pid} working"


def _read_marker(path: Path) -> dict[str, Any]:
    """A marker's content; an unreadable one (an older processor's empty file) says nothing but its age."""
    try:
        content = json.loads(path.read_text() or "{}")
    except json.JSONDecodeError:
        return {}
    return content if isinstance(content, dict) else {}


def daemon_running(pid: int | None) -> bool:
    """A live process (``pid``, or any) runs the MultiLangDaemon. A zombie's command line is empty: not running."""
    pids = [pid] if pid is not None else [int(entry.name) for entry in PROC.iterdir() if entry.name.isdigit()]
    return any(DAEMON_CLASS in _command_line(p) for p in pids)


def markers(health_file: str) -> Iterator[tuple[int, Path]]:
    """The record processors' message markers beside ``health_file``: (pid, path)."""
    path = Path(health_file)
    prefix = f"{path.name}.kcl-"
    with contextlib.suppress(FileNotFoundError):
        for entry in path.parent.iterdir():
            if entry.name.startswith(prefix) and entry.name[len(prefix) :].isdigit():
                yield int(entry.name[len(prefix) :]), entry


def _age(path: Path) -> float:
    return time.time() - path.stat().st_mtime


def _alive(pid: int) -> bool:
    return bool(_command_line(pid))


def _command_line(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class MessageMarker:
    """A KCL record processor's marker: present from a message's arrival to its answer, and rewritten with what the
    processor is doing each time it comes round (an attempt, a slice of a wait, a checkpoint, a look at the switch).

    Its content is one JSON object: ``state`` (``PROGRESSING``, ``PAUSED`` or ``STUCK``) and facts for the check's
    line (``giveUpAt``: when the oldest failing record is due to be given up, epoch seconds; ``records``).
    """

    def __init__(self, health_file: str) -> None:
        self.path = Path(f"{health_file}.kcl-{os.getpid()}")

    @contextlib.contextmanager
    def working(self) -> Iterator[None]:
        """Mark the message in hand until it is answered (or the process ends)."""
        self.mark(PROGRESSING)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.remove(self.path)

    def mark(self, state: str, **facts: Any) -> None:
        """Note that the processor came round, and in which state. A marker that cannot be written is no marker: the
        check then sees an idle processor, never a wedged one."""
        partial = self.path.with_name(f".{self.path.name}.partial")
        with contextlib.suppress(OSError):
            partial.write_text(json.dumps({"state": state, **facts}))
            os.replace(partial, self.path)  # the check never reads half a marker
