"""The start-up check that the installed libraries are at least the versions this worker declares.

pip keeps a library that is already installed when it satisfies nothing stricter than what it was asked for, and a
Lambda layer or a base image can put an older boto3 or botocore ahead of ours on ``sys.path``. Below a floor the
worker does not fail cleanly: a missing botocore feature, for instance, breaks every AWS call after it has taken a
concurrency slot. So each entry point refuses to start instead, with one line naming the package, the version found
and the version required: the CLI exits 2, the Lambda handlers log one ERROR line and touch no record.

A refusal is meant to happen at build time, not in a deployed function: the Lambda artifact's build (deploy/Makefile)
runs :func:`main` on the artifact alone, and fails on the same versions the handlers refuse, so such an artifact is
never deployed. A function refused anyway (a layer or a hand-made package shadowing ours) reports its whole batch
failed: the mapping retries it MaximumRetryAttempts times and then sends its range to the on-failure queue, from
which ``cleanup-worker redrive`` re-reads it once a fixed deployment is out, while the stream still holds it (24 h).

The floors are read from this distribution's own metadata (``Requires-Dist``, written from pyproject.toml), so they are
declared in one place. Standard library only: the point is to run before anything that an old library could break.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable
from functools import cache
from importlib import metadata

DISTRIBUTION = "session-cleanup-worker"

# "name[extra,...] >=1.2, <3 ; marker": the name, the specifiers, the marker (``packaging`` is not a dependency).
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*)(?:;(.*))?$")
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version: ``"3.1.3.post4"`` -> ``(3, 1, 3)``, ``"2.0rc1"`` -> ``(2, 0)``."""
    parts: list[int] = []
    for part in version.split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.end() < len(part):  # "0rc1": a pre-release of 0, nothing after it is part of the release
            break
    while parts and parts[-1] == 0:  # 1.2 == 1.2.0
        parts.pop()
    return tuple(parts)


def floors(extras: Iterable[str] = ()) -> dict[str, str]:
    """The ``>=`` floor of each requirement of the core and of ``extras``, by distribution name.

    Empty when this distribution is not installed (run from a source tree): there is nothing to check against.
    """
    try:
        requirements = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return {}
    wanted = set(extras)
    found: dict[str, str] = {}
    for line in requirements:
        match = _REQUIREMENT.match(line)
        if match is None:
            continue
        name, specifiers, marker = match.groups()
        extra = _EXTRA.search(marker or "")
        if (extra is not None and extra.group(1) not in wanted) or (extra is None and marker):
            continue  # another extra's, or a platform's: not ours to judge
        for specifier in specifiers.split(","):
            if specifier.strip().startswith(">="):
                found[name] = specifier.strip()[2:].strip()
    return found


def problem(extras: Iterable[str] = (), installed: Callable[[str], str] = metadata.version) -> str | None:
    """One line naming the first installed library below its floor, or None when all are at or above theirs.

    A library that is not installed at all is left to the import that needs it (a missing extra has its own message).
    """
    for name, floor in floors(extras).items():
        try:
            version = installed(name)
        except metadata.PackageNotFoundError:
            continue
        if release(version) < release(floor):
            return f"{name} {version} is installed, but {DISTRIBUTION} needs {name}>={floor}"
    return None


@cache
def core_problem() -> str | None:
    """:func:`problem` for the core requirements, checked once per process (a Lambda environment does not change)."""
    return problem()


def main() -> int:
    """The build's check (``python -I -S`` with only the artifact on ``sys.path``): exit 1 with the handlers' refusal
    line on stderr when a library is below its floor, 0 otherwise."""
    found = problem()
    if found is None:
        return 0
    print(f"refusing the build: {found}", file=sys.stderr)
    return 1
