"""The version tests: the test modules whose outcome a library's or Python's version can change, which CI's version
tiers run again at the lowest versions, at the runtime lock's on Python 3.12 and at the newest on Python 3.13
(``scripts/tiers``; ``pytest -m versions``). Every other module tests the worker's own logic, the same on every
version: the full suite runs it once.

Each module (or, for a module whose other tests exercise the worker's own logic, each test: ``module::test``) is listed
with what in it depends on a version.
"""

from __future__ import annotations

VERSION_MODULES: dict[str, str] = {
    # The tools the suite runs, each at its floor and its newest.
    "test_quality": "ruff's rules and mypy (with boto3-stubs) on the packages",
    "test_layers": "import-linter's contracts",
    "test_docs": "mkdocs builds the site; the reference pages from argparse's help and cfn-lint's template decoding",
    "test_docs_commands": "argparse parses every documented command",
    "test_template": "cfn-lint validates the template",
    "test_template_kinds": "cfn-lint validates each kind's template",
    "test_template_build": "setuptools builds the artifact the template names",
    "test_packaging": "the wheel and sdist setuptools builds, and what they hold",
    "test_startup": "the declared floors against what is installed; the extras' imports",
    "test_readme": "the README's commands",
    # What the worker relies on in its libraries.
    "test_configuration": "pydantic-settings reads the environment (NoDecode lists, aliases, nested ATTR_*)",
    "test_cli_invocation": "pydantic-settings' sources, botocore's profiles and regions",
    "test_cli_errors": "pydantic's and botocore's errors, told in one line",
    "test_cli": "argparse",
    "test_records_and_classify": "pydantic models of stream records",
    "test_attributes": "decoding equal to boto3's TypeDeserializer (hypothesis)",
    "test_pacing_scope": "botocore's event hooks, request contexts and retries",
    "test_gate": "botocore's before-send: the permit asked where a freeing request leaves",
    "test_control_calls": "botocore's clients and hooks for the control calls",
    "test_proxy": "botocore's parsing of faults, resets and timeouts",
    "test_batch_calls": "BatchGetItem and DeleteObjects answers as botocore parses them (moto)",
    "test_connection_action": "the Management API client (botocore) against the local gateway",
    "test_http_close": "SigV4 signing (botocore) and http.client",
    "test_registry": "tenacity's retries of unprocessed items; BatchWriteItem (moto)",
    "test_deadletter": "tenacity's retries; SQS and S3 (moto)",
    "test_lambda_handler": "the handler end to end through botocore against moto",
    "test_killswitch": "the AppConfig agent's answers over http.client",
    "test_gateway": "the local WebSocket gateway (aiohttp, hypercorn, websockets)",
    # The KCL's MultiLangDaemon protocol and checkpointer (amazon_kclpy); the module's other tests are the in-place
    # retries' logic, the same on every version.
    "test_kcl::test_a_batch_of_deletes_is_cleaned_and_checkpointed_at_its_last_record": "the protocol's round trip",
    "test_kcl::test_stdout_carries_only_protocol_messages": "what the protocol reads on stdout",
    "test_kcl::test_shutdown_requested_checkpoints_what_is_done": "the shutdown-requested call",
    "test_kcl::test_shard_end_is_checkpointed_when_every_record_is_clean": "the shard-end call",
    "test_kcl::test_lease_lost_stops_without_a_checkpoint": "the checkpointer's lease-lost exception",
    "test_kcl::test_a_checkpoint_refused_other_than_for_a_lost_lease_exits_without_acknowledging_the_batch": (
        "the checkpointer's other exceptions"
    ),
    "test_telemetry": "logging's records and JSON formatting",
    "test_property": "hypothesis' strategies",
}
