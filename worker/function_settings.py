"""``--function-name NAME``: an operator's command runs with a deployed function's exact settings.

The commands that act for a deployment (``redrive``, ``replay``, ``reconcile``, ``status``, ``check``, ``retag``) read
the worker's settings from the environment, as the function does. An operator's shell that differs from the function
in one setting (a forgotten ``ATTR_CONNECTION_ID=pk``) reads every record otherwise: a session skipped as "not a
session", a socket never closed. With ``--function-name`` the command asks Lambda for the function's configuration
(``GetFunctionConfiguration``; the operator needs ``lambda:GetFunctionConfiguration``, which the template's
``OperatorPolicy`` grants) and runs with its environment variables as the worker's settings:

* every setting the function sets is taken from it, whatever the shell says;
* every setting it leaves unset is unset for the run too (its default, as in the function);
* except the command's own output (LOG_LEVEL, METRICS_DESTINATION) and where to reach AWS (``AWS_*``), which stay the
  operator's; and CLEANUP_MODE, which is the more careful of the two: a dry run asked in the shell stays one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import boto3

from cleanup.aws.answers import needed
from cleanup.aws.calls import call
from cleanup.aws.clients import Reach
from cleanup.exceptions import PermanentError
from schemas.settings import CleanupMode, variables

COMMANDS = frozenset({"redrive", "replay", "reconcile", "status", "check", "retag"})
"""The commands that take ``--function-name``."""
OPERATOR_OWN = frozenset({"LOG_LEVEL", "METRICS_DESTINATION"})
"""Settings of the command's own output, which stay the operator's."""


def function_environment(name: str, reach: Reach | None = None) -> dict[str, str]:
    """The environment variables of the deployed function ``name`` (its name, ARN or partial ARN), asked of Lambda
    where ``reach`` says.

    Raises:
        TransientError / PermanentError: Lambda could not answer (no such function, access denied), or the function's
            environment could not be read (KMS refused to decrypt it), or it has none.
    """
    reach = reach or Reach()
    session = boto3.session.Session(profile_name=reach.profile, region_name=reach.region)
    client: Any = session.client("lambda", endpoint_url=reach.endpoint_url)
    answer = call(client.get_function_configuration, "GetFunctionConfiguration", None, FunctionName=name)
    environment = answer.get("Environment") or {}
    error = environment.get("Error")
    if error:
        raise PermanentError(f"function {name}'s environment cannot be read: {error.get('Message', error)}")
    found = needed(answer, "GetFunctionConfiguration", "Environment", "Variables", kind=dict)
    return {str(key): str(value) for key, value in found.items()}


def changes(function: Mapping[str, str], shell: Mapping[str, str]) -> dict[str, str | None]:
    """What to set (a value) or unset (None) in ``shell`` for a run with ``function``'s settings."""
    result: dict[str, str | None] = {}
    for variable in variables():
        if variable in OPERATOR_OWN:
            continue
        wanted = function.get(variable)
        if wanted != shell.get(variable):
            result[variable] = wanted
    if shell.get("CLEANUP_MODE") == CleanupMode.DRY_RUN.value:  # a dry run asked for in the shell stays one
        result.pop("CLEANUP_MODE", None)
    return result
