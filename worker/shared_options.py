"""The options every ``cleanup-worker`` sub-command shares, as in the AWS CLI: ``--region``, ``--profile`` and
``--endpoint-url`` on each command that calls AWS, ``--verbose`` on the one-shot commands, two or three examples at
the end of each ``--help``, and one line (never a traceback) for wrong input.

What the options become is the command's ``Invocation``, set on its arguments (``args.invocation``) and read by the
command when it makes its settings, runtime and clients (``runtime``, ``settings``, ``clients``); the process's
environment is never written:

* the AWS options go to the client factory (``cleanup.aws.clients.Reach``); ``AWS_REGION``, which botocore does not
  read, is the region when ``AWS_DEFAULT_REGION`` is unset;
* the settings' environment is the shell's, with, for ``--function-name``, the deployed function's settings in place
  of the shell's (``worker.function_settings``); and a one-shot command's output is its output: its logs go to stderr
  at WARNING and above and it writes no metrics, unless ``--verbose`` (or LOG_LEVEL / METRICS_DESTINATION, set
  explicitly) says otherwise.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

import botocore.session
from botocore.exceptions import BotoCoreError

from cleanup.aws.clients import Clients, Reach
from cleanup.exceptions import CleanupError
from schemas.settings import Settings
from worker import function_settings

if TYPE_CHECKING:
    from cleanup.runtime import Runtime

AWS_FREE = frozenset({"demo", "health"})
"""Sub-commands that make no AWS call of their own (the demo brings its own embedded AWS)."""

ONE_SHOT = frozenset({"replay", "capture", "redrive", "retag", "sweep", "reconcile", "check", "status", "switch"})
"""Sub-commands whose printed report is their output (``run``, ``kcl`` and ``drain`` are services: logs are theirs)."""

EXAMPLES: dict[str, tuple[str, ...]] = {
    "demo": (
        "cleanup-worker demo",
        "cleanup-worker demo --objects 200 --verbose",
        "cleanup-worker demo --preset connection-table",
    ),
    "run": (
        "cleanup-worker run --table-name sessions",
        "cleanup-worker run --table-name sessions --consumer-id cleanup-a --region eu-west-1",
    ),
    "kcl": ("java ... MultiLangDaemon --properties-file deploy/kcl/cleanup.properties   # runs: cleanup-worker kcl",),
    "replay": (
        "cleanup-worker replay --dry-run captured.jsonl",
        "cleanup-worker replay --dry-run events/lambda-dynamodb-ttl-remove.json",
    ),
    "capture": (
        "cleanup-worker capture --table-name sessions --out records.jsonl",
        "cleanup-worker capture --table-name sessions --from latest --follow --out live.jsonl",
    ),
    "drain": (
        "cleanup-worker drain --queue-url https://sqs.eu-west-1.amazonaws.com/123456789012/cleanup-backlog",
        "cleanup-worker drain --until-idle",
    ),
    "redrive": (
        "cleanup-worker redrive --function-name cleanup-function "
        "--queue-url https://sqs.eu-west-1.amazonaws.com/123456789012/cleanup-on-failure",
    ),
    "retag": (
        "cleanup-worker retag --queue-url https://sqs.eu-west-1.amazonaws.com/123456789012/cleanup-backlog",
        "cleanup-worker retag --function-name cleanup-drain --queue-url <BacklogDeadLetterQueueUrl> --json",
    ),
    "sweep": ("cleanup-worker sweep --table-name sessions", "EXPIRY_INDEX=expiry-index cleanup-worker sweep --verbose"),
    "reconcile": ("cleanup-worker reconcile", "cleanup-worker reconcile --json"),
    "check": ("cleanup-worker check --table-name sessions --bucket scratch --region eu-west-1",),
    "health": ("cleanup-worker health", "cleanup-worker health --kcl"),
    "status": ("cleanup-worker status --table-name sessions", "cleanup-worker status --json"),
    "canary": (
        "cleanup-worker canary",
        "cleanup-worker canary --json --region eu-west-1",
    ),
    "switch": (
        "cleanup-worker switch status",
        "cleanup-worker switch pause --application abc1234 --environment def5678 --configuration-profile ghi9012 "
        "--strategy jkl3456",
        "cleanup-worker switch resume --json",
    ),
}


class OneLineParser(argparse.ArgumentParser):
    """Wrong usage is one line on stderr (what is wrong and where ``--help`` is), then exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def decorate(command: str, parser: argparse.ArgumentParser) -> None:
    """Give ``command``'s parser the shared options and its examples."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "examples:\n" + "\n".join(f"  {example}" for example in EXAMPLES.get(command, ()))
    known = {option for action in parser._actions for option in action.option_strings}
    if command not in AWS_FREE:
        aws = parser.add_argument_group("AWS (as in the AWS CLI)")
        aws.add_argument("--region", help="the AWS region [AWS_REGION / AWS_DEFAULT_REGION]")
        aws.add_argument("--profile", help="a named profile of ~/.aws/config [AWS_PROFILE]")
        aws.add_argument("--endpoint-url", help="send every AWS call to this endpoint [AWS_ENDPOINT_URL]")
    if command in function_settings.COMMANDS:
        parser.add_argument(
            "--function-name",
            metavar="NAME",
            help="run with this deployed function's settings: its environment (lambda:GetFunctionConfiguration)",
        )
    if command in ONE_SHOT and "--verbose" not in known:
        parser.add_argument("--verbose", action="store_true", help="also show the worker's logs and metrics on stderr")


@dataclass(frozen=True)
class Invocation:
    """What a command's shared options say: the environment its settings are read from, and how its clients reach
    AWS."""

    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    reach: Reach = field(default_factory=Reach)


def invocation(command: str, args: argparse.Namespace, shell: Mapping[str, str] = os.environ) -> Invocation | str:
    """``command``'s invocation from its options and ``shell``'s environment, or why it cannot reach AWS (no region,
    an unknown profile, a function whose settings cannot be read)."""
    reach = Reach(
        region=getattr(args, "region", None) or (None if shell.get("AWS_DEFAULT_REGION") else shell.get("AWS_REGION")),
        profile=getattr(args, "profile", None),
        endpoint_url=getattr(args, "endpoint_url", None),
    )
    environ = dict(shell)
    if command in ONE_SHOT and not getattr(args, "verbose", False):
        environ.update({name: value for name, value in QUIET.items() if name not in shell})
    problem = None if command in AWS_FREE else _unreachable(reach)
    function = getattr(args, "function_name", None)
    if problem is None and function:
        try:
            taken = function_settings.changes(function_settings.function_environment(function, reach), environ)
        except CleanupError as exc:
            return f"cannot take the settings of function {function!r}: {exc}"
        for name, value in taken.items():
            if value is None:
                environ.pop(name, None)
            else:
                environ[name] = value
    return problem or Invocation(environ, reach)


def of(args: argparse.Namespace) -> Invocation:
    """The invocation ``cleanup-worker`` set on ``args`` (a command called without it: the process's environment)."""
    found = getattr(args, "invocation", None)
    return found if isinstance(found, Invocation) else Invocation()


def settings(args: argparse.Namespace, model: type[Settings] = Settings) -> Settings:
    """The command's settings (``model``'s), read from its invocation's environment."""
    return model.from_env(of(args).environ)


def runtime(args: argparse.Namespace, **overrides: Any) -> Runtime:
    """The command's runtime: its settings (then ``overrides``), and clients that reach AWS as its options say."""
    from cleanup.runtime import Runtime  # the command's, not the parser's: ``health`` starts without it

    given = of(args)
    return Runtime.from_env(environ=given.environ, reach=given.reach, **overrides)


def clients(args: argparse.Namespace, settings: Settings) -> Clients:
    """Clients for ``settings`` that reach AWS as the command's options say."""
    return Clients(settings, reach=of(args).reach)


QUIET = {"LOG_LEVEL": "WARNING", "METRICS_DESTINATION": "off"}


def _unreachable(reach: Reach) -> str | None:
    try:
        region = reach.region or botocore.session.Session(profile=reach.profile).get_config_variable("region")
    except BotoCoreError as exc:  # ProfileNotFound and friends: the message names the profile
        return f"{exc}: fix --profile or AWS_PROFILE"
    if not region:
        return "no AWS region: pass --region or set AWS_REGION (e.g. --region eu-west-1)"
    return None
