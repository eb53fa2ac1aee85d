"""``cleanup-worker check``: preflight the account against the worker's settings, one line per check.

Each option defaults to the worker's own setting (the environment variable in brackets), so running it with the
deployed function's environment checks exactly what the function will use: what its actions (ACTIONS) need, and
nothing else. Exit 0 when every check passed; 2 when a
check found the account disagreeing with the settings (a configuration to fix, as for any refused setting); 1 when a
check could not ask AWS at all (credentials, network, a throttled call).
"""

from __future__ import annotations

import argparse
import sys
from typing import ClassVar

from cleanup.actions.http_close import ACTION as HTTP_CLOSE
from cleanup.operations.preflight import CheckResult, Target, run_checks
from schemas.settings import Settings
from worker import shared_options
from worker.exit_codes import ExitCode


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--table-name", help="the session table [SESSION_TABLE]")
    parser.add_argument("--ttl-attribute", help="the attribute TTL must be enabled on [ATTR_TTL, default ttl]")
    parser.add_argument("--bucket", help="the scratch bucket [SCRATCH_BUCKET]")
    parser.add_argument("--scratch-root", help="the root the lifecycle backstop must cover [SCRATCH_ROOT]")
    parser.add_argument("--kms-key-id", help="the grants' key, as an ARN [KMS_KEY_ID]")
    parser.add_argument("--callback-url", help="the WebSocket management endpoint [WS_CALLBACK_URL]")
    parser.add_argument("--registry-table", help="the connection registry [REGISTRY_TABLE]")
    parser.add_argument("--registry-index", help="its index on the connection id [REGISTRY_CONNECTION_INDEX]")
    parser.add_argument("--actions", help="the action kinds whose needs are checked, comma-separated [ACTIONS]")
    parser.add_argument(
        "--worker-role-arn",
        help="the role the grants must name as retiring principal (the stack's CleanupRoleArn) [the caller's identity]",
    )


class PreflightSettings(Settings):
    """The worker's settings, except that a dead-letter prefix overlapping the scratch root is a failed check here,
    with its fix, instead of a refusal to start."""

    refuse_dead_letter_overlap: ClassVar[bool] = False


def main(args: argparse.Namespace) -> int:
    """Run every check, print one line each, and exit non-zero if any failed."""
    settings = shared_options.settings(args, PreflightSettings)
    results = run_checks(shared_options.clients(args, settings), target_from(args, settings))
    for result in results:
        print(format_line(result))
    failed = [result for result in results if not result.passed]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed", file=sys.stderr)
    if any(result.unchecked for result in failed):
        return ExitCode.FAILED
    return ExitCode.USAGE if failed else ExitCode.OK


def target_from(args: argparse.Namespace, settings: Settings) -> Target:
    """The settings, with what the command line gives instead."""
    given = {
        "session_table": args.table_name,
        "scratch_bucket": args.bucket,
        "scratch_root": args.scratch_root,
        "kms_key_id": args.kms_key_id,
        "ws_callback_url": args.callback_url,
    }
    settings = settings.model_copy(update={name: value for name, value in given.items() if value})
    return Target(
        table=args.table_name or settings.session_table,
        ttl_attribute=args.ttl_attribute or settings.attributes.ttl,
        bucket=args.bucket or settings.scratch_bucket,
        scratch_root=args.scratch_root or settings.scratch_root,
        kms_key_id=args.kms_key_id or settings.kms_key_id,
        callback_url=args.callback_url or settings.ws_callback_url,
        dead_letter_queue_url=settings.dead_letter_queue_url,
        dead_letter_bucket=settings.dead_letter_bucket,
        dead_letter_prefix=settings.dead_letter_prefix,
        registry_table=args.registry_table or settings.registry_table,
        registry_index=args.registry_index or settings.registry_connection_index,
        registry_attribute=settings.attributes.registry_connection_id,
        expiry_index=settings.expiry_index,
        expiry_bucket_attribute=settings.attributes.expiry_bucket,
        backlog_queue_url=settings.backlog_queue_url,
        integrity_key_id=settings.integrity_key_id,
        close=settings if HTTP_CLOSE in settings.actions else None,
        actions=frozenset(name.strip() for name in args.actions.split(","))
        if args.actions
        else frozenset(settings.actions),
        settings=settings,
        worker_principal=args.worker_role_arn,
    )


def format_line(result: CheckResult) -> str:
    """``ok   name: detail`` or ``FAIL name: detail -- fix: ...``."""
    if result.passed:
        return f"ok   {result.name}: {result.detail}"
    return f"FAIL {result.name}: {result.detail} -- fix: {result.fix}"
