"""``cleanup-worker health``: exit 0 while the worker in this container makes progress, 1 when it does not.

Made for a Dockerfile ``HEALTHCHECK`` (no curl, no port, nothing but the files the worker writes); the one line it
prints says why, and the orchestrator keeps it (``docker inspect``).

* The stream poller (``cleanup-worker run``) touches HEALTH_FILE each time its loop comes round: healthy while the
  file is younger than HEALTH_STALE_SECONDS. The file is removed when the poller stops. A poller whose stream has
  ended (disabled, or gone) with no new stream to follow is unhealthy, whatever its pulse: it cleans nothing
  (``<HEALTH_FILE>.stream`` says why).
* The KCL image (``--kcl``): the MultiLangDaemon (java) is running, and no record processor has held one of its
  messages for HEALTH_STALE_SECONDS without a checkpoint. Each processor marks the message it works on in
  ``<HEALTH_FILE>.kcl-<pid>`` (``MessageMarker``): created when the message arrives, touched at each checkpoint,
  removed when it is answered. An idle processor, or a worker holding no shard, has no marker and is healthy.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cleanup.exceptions import ConfigurationError
from cleanup.streams.stream_state import stream_problem
from schemas.settings import Settings, configuration_problems
from worker.exit_codes import ExitCode

DAEMON_CLASS = "software.amazon.kinesis.multilang.MultiLangDaemon"
PROC = Path("/proc")


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
    problem = kcl_problem(settings, args.daemon_pid) if args.kcl else poller_problem(settings)
    if problem is not None:
        return _unhealthy(problem)
    print("healthy")
    return ExitCode.OK


def _unhealthy(problem: str) -> int:
    print(f"unhealthy: {problem}")
    return ExitCode.FAILED


def poller_problem(settings: Settings) -> str | None:
    """Why the stream poller is not healthy, or None: first a stream it cannot consume (disabled, or gone), then its
    loop's pulse."""
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
    return None


def kcl_problem(settings: Settings, daemon_pid: int | None) -> str | None:
    """Why the KCL daemon or one of its record processors is not healthy, or None."""
    if not daemon_running(daemon_pid):
        return f"the KCL MultiLangDaemon is not running ({DAEMON_CLASS})"
    for pid, path in markers(settings.health_file):
        try:
            age = _age(path)
        except OSError:
            continue  # answered (removed) while we looked
        if age >= settings.stale_after and _alive(pid):
            return f"record processor {pid} has held a message for {age:.0f} s without a checkpoint"
    return None


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
    """A KCL record processor's marker: present from a message's arrival to its answer, touched at each checkpoint."""

    def __init__(self, health_file: str) -> None:
        self.path = Path(f"{health_file}.kcl-{os.getpid()}")

    @contextlib.contextmanager
    def working(self) -> Iterator[None]:
        """Mark the message in hand until it is answered (or raises: amazon_kclpy answers it all the same)."""
        self.touch()
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.remove(self.path)

    def touch(self) -> None:
        """Note progress on the message in hand (a checkpoint). A marker that cannot be written is no marker: the
        check then sees an idle processor, never a wedged one."""
        with contextlib.suppress(OSError):
            self.path.touch()


class Watched:
    """A v3 record processor whose every message is marked (``MessageMarker``) while it is handled."""

    version = 3

    def __init__(self, processor: Any, marker: MessageMarker) -> None:
        self._processor = processor
        self._marker = marker

    def initialize(self, message: Any) -> None:
        with self._marker.working():
            self._processor.initialize(message)

    def process_records(self, message: Any) -> None:
        with self._marker.working():
            self._processor.process_records(message)

    def lease_lost(self, message: Any) -> None:
        with self._marker.working():
            self._processor.lease_lost(message)

    def shard_ended(self, message: Any) -> None:
        with self._marker.working():
            self._processor.shard_ended(message)

    def shutdown_requested(self, message: Any) -> None:
        with self._marker.working():
            self._processor.shutdown_requested(message)


class MarkingCheckpointer:
    """amazon_kclpy's checkpointer, touching the marker on each checkpoint the processor asks for."""

    def __init__(self, checkpointer: Any, marker: MessageMarker) -> None:
        self._checkpointer = checkpointer
        self._marker = marker

    def checkpoint(self, sequence_number: str | None = None, sub_sequence_number: int | None = None) -> None:
        self._marker.touch()
        self._checkpointer.checkpoint(sequence_number, sub_sequence_number)
