"""The habits every ``cleanup-worker`` sub-command shares with the AWS CLI: ``--region``, ``--profile`` and
``--endpoint-url`` on each command that calls AWS, ``--verbose`` on the one-shot commands, two or three examples at
the end of each ``--help``, and one line (never a traceback) for wrong input.

The AWS options are handed to botocore the standard way, through its environment variables (``AWS_DEFAULT_REGION``,
``AWS_PROFILE``, ``AWS_ENDPOINT_URL``), before the command makes its first client. ``AWS_REGION``, which Lambda
sets and botocore does not read, is honoured everywhere by copying it to ``AWS_DEFAULT_REGION`` when that is unset.
A one-shot command's output is its output: its logs go to stderr at WARNING and above and it writes no metrics,
unless ``--verbose`` (or LOG_LEVEL / METRICS_DESTINATION, set explicitly) says otherwise.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import botocore.session
from botocore.exceptions import BotoCoreError

from cleanup.exceptions import CleanupError
from worker import function_settings

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


@contextmanager
def environment(command: str, args: argparse.Namespace) -> Iterator[str | None]:
    """Put the shared options in the environment botocore and the settings read, for the command's run (restored
    after it); yields why the command cannot reach AWS (no region, an unknown profile), or None."""
    changes: dict[str, str] = {}
    if os.environ.get("AWS_REGION") and not os.environ.get("AWS_DEFAULT_REGION"):
        changes["AWS_DEFAULT_REGION"] = os.environ["AWS_REGION"]
    for option, variables in (
        ("region", ("AWS_DEFAULT_REGION", "AWS_REGION")),
        ("profile", ("AWS_PROFILE",)),
        ("endpoint_url", ("AWS_ENDPOINT_URL",)),
    ):
        value = getattr(args, option, None)
        changes.update(dict.fromkeys(variables, value) if value else {})
    if command in ONE_SHOT and not getattr(args, "verbose", False):
        changes.update({name: value for name, value in QUIET.items() if name not in os.environ})
    saved = {name: os.environ.get(name) for name in changes}
    os.environ.update(changes)
    try:
        problem = None if command in AWS_FREE else _unreachable()
        function = getattr(args, "function_name", None)
        if problem is None and function:
            problem = _take_function_settings(function, saved)
        yield problem
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _take_function_settings(function: str, saved: dict[str, str | None]) -> str | None:
    """Put ``function``'s settings in the environment (what they replace is added to ``saved``, to be restored);
    returns why they could not be read, or None."""
    try:
        taken = function_settings.changes(function_settings.function_environment(function), os.environ)
    except CleanupError as exc:
        return f"cannot take the settings of function {function!r}: {exc}"
    for name, value in taken.items():
        saved.setdefault(name, os.environ.get(name))
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return None


QUIET = {"LOG_LEVEL": "WARNING", "METRICS_DESTINATION": "off"}


def _unreachable() -> str | None:
    try:
        region = botocore.session.Session().get_config_variable("region")
    except BotoCoreError as exc:  # ProfileNotFound and friends: the message names the profile
        return f"{exc}: fix --profile or AWS_PROFILE"
    if not region:
        return "no AWS region: pass --region or set AWS_REGION (e.g. --region eu-west-1)"
    return None
