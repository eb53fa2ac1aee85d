"""``cleanup-worker``: one command, one sub-command per way of running the worker.

Each sub-command lives in its own module exposing ``add_arguments(parser)`` and ``main(args) -> int``. Only the
chosen sub-command's module is imported (a container running ``kcl`` does not load the demo's moto), and the exit
code is the module's. Invalid settings end any sub-command the same way: one line on stderr naming each bad
environment variable and why, and exit code 2. So do an installed library below its declared floor
(:mod:`worker.floors`) and a sub-command whose optional extra is not installed (one line naming the ``pip install``
that provides it).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib import metadata

from botocore.exceptions import BotoCoreError, NoCredentialsError, NoRegionError, ProfileNotFound
from pydantic import ValidationError

from cleanup.exceptions import CleanupError, ConfigurationError, MissingConfigError
from schemas.settings import configuration_problems
from worker import floors, shared_options
from worker.exit_codes import ExitCode

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("worker.demo", "run the demo on an embedded moto server and a local WebSocket gateway"),
    "run": ("worker.poller", "consume a DynamoDB stream (single active consumer, checkpoints in DynamoDB)"),
    "kcl": ("worker.kcl", "record processor for the KCL MultiLangDaemon (speaks its protocol on stdin/stdout)"),
    "replay": ("worker.replay", "clean the sessions of captured records (Lambda events, GetRecords, JSON lines)"),
    "capture": ("worker.capture", "write a stream's records to a JSON-lines file"),
    "drain": ("worker.drain", "drain the backlog queue of quota-bound work (as the drain function does in Lambda)"),
    "redrive": ("worker.redrive", "re-process the batches named by on-failure or dead-letter messages"),
    "retag": ("worker.retag", "tag the worker's messages on a queue again with INTEGRITY_KEY_ID (a key rotation)"),
    "sweep": ("worker.sweep", "delete the sessions whose ttl has passed (instead of waiting for DynamoDB TTL)"),
    "reconcile": ("worker.reconcile", "free the grants and scratch prefixes of gone sessions that the stream missed"),
    "check": ("worker.check", "preflight: check the account's configuration against the worker's settings"),
    "health": ("worker.health", "container health check: exit 0 while the poller (or, with --kcl, the KCL) progresses"),
    "status": ("worker.status", "show mode, kill switch, checkpoints and lag, lease, queues and the last sweep"),
    "canary": ("worker.canary", "end a canary session and time until the worker has freed it (alarms when it has not)"),
    "switch": ("worker.switch", "show or flip the kill switch in AppConfig: status, pause, dry-run, resume"),
}

EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "demo": ("local", ("aiohttp", "hypercorn", "moto.server")),
    "kcl": ("kcl", ("amazon_kclpy",)),
}
"""The sub-commands that need an optional extra: the extra, and the modules it provides (imported by the command)."""


def version() -> str:
    """This distribution's installed version ("unknown" when run from a source tree that is not installed)."""
    try:
        return metadata.version(floors.DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line; only ``command``'s module is imported (all of them when it is None)."""
    parser = shared_options.OneLineParser(
        prog="cleanup-worker", description="Cleans up after expired sessions from a DynamoDB stream."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, summary) in COMMANDS.items():
        sub = commands.add_parser(name, help=summary, description=summary)
        if command is None or name == command:
            module = importlib.import_module(module_name)
            module.add_arguments(sub)
            shared_options.decorate(name, sub)
            sub.set_defaults(handler=module.main)
    return parser


def refusal(command: str | None) -> str | None:
    """Why ``command`` cannot start here (a library below its floor, its extra missing), or None when it can."""
    extra, modules = EXTRAS.get(command or "", ("", ()))
    for module in modules:  # the command imports them late, after its set-up: fail here, before it
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            where = f"pip install '.[{extra}]' in the project's clone (or the wheel's path with [{extra}])"
            return f"needs the [{extra}] extra ({exc}): {where}"
    return floors.problem([extra] if extra else [])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    command = command if command in COMMANDS else None
    asks_help = "-h" in argv or "--help" in argv  # help needs no extra: the command's module imports it late
    if command is not None and not asks_help and (problem := refusal(command)) is not None:
        print(f"cleanup-worker {command}: {problem}", file=sys.stderr)
        return ExitCode.USAGE
    args, unknown = build_parser(command).parse_known_args(argv)
    if unknown:
        where = f"cleanup-worker {args.command}"
        print(f"{where}: unrecognized arguments: {' '.join(unknown)} (see {where} --help)", file=sys.stderr)
        return ExitCode.USAGE
    given = shared_options.invocation(args.command, args)
    if isinstance(given, str):
        print(f"cleanup-worker {args.command}: {given}", file=sys.stderr)
        return ExitCode.USAGE
    args.invocation = given
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.handler(args))
    except ValidationError as exc:  # the settings, read from the environment by the command
        return _one_line(args, ConfigurationError(configuration_problems(exc)), ExitCode.USAGE)
    except (ConfigurationError, MissingConfigError, NoRegionError, NoCredentialsError, ProfileNotFound) as exc:
        return _one_line(args, exc, ExitCode.USAGE)
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except (CleanupError, BotoCoreError, OSError) as exc:  # the command's own failures, not a bug: one line
        return _one_line(args, exc, ExitCode.FAILED)


def _one_line(args: argparse.Namespace, exc: BaseException, code: ExitCode) -> int:
    if getattr(args, "verbose", False):
        raise exc
    print(f"cleanup-worker {args.command}: {' '.join(str(exc).split())}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
