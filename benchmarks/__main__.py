"""The benchmarks' one entry point: list them, run one by name, or run the whole suite.

    python -m benchmarks list                     # each benchmark's name and purpose
    python -m benchmarks run capacity --table     # one by name; what follows the name is its own arguments
    python -m benchmarks all --quick              # the suite (sections 1 to 9), as ``python -m benchmarks.run``

Each benchmark stays a module that runs on its own (``python -m benchmarks.capacity``): running one by name runs that
module as ``__main__`` with the arguments given, so both print the same.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    """A benchmark: its name, the module that runs it, and what it measures in one line."""

    name: str
    module: str
    purpose: str


CATALOGUE = (
    Benchmark("suite", "benchmarks.run", "every section of benchmarks/README.md in one run, as Markdown with ratios"),
    Benchmark("capacity", "benchmarks.capacity", "the capacity model: how long a mass expiry takes, what it loses"),
    Benchmark("mass-expiry", "benchmarks.mass_expiry", "a mass expiry through the real worker on moto, as modelled"),
    Benchmark("quota", "benchmarks.quota", "pacing under a RetireGrant quota: throttles per call, share of the quota"),
    Benchmark("pacing", "benchmarks.pacing", "the pacing model: laws side by side on seeded draws, targets met"),
    Benchmark("noise", "benchmarks.noise", "scattered throttling: a noisy batch and the clean one after, as ratios"),
    Benchmark("replay-memory", "benchmarks.replay_memory", "peak RSS of replay on a small and on a large file"),
    Benchmark("integrity", "benchmarks.integrity", "what the integrity tag costs per message: KMS calls and time"),
    Benchmark("soak", "benchmarks.soak", "waves of sessions with faults at the wire for minutes; residue must be 0"),
)
USAGE = "usage: python -m benchmarks {list | run NAME [ARGUMENTS...] | all [ARGUMENTS...]}"


def listing() -> str:
    """One line a benchmark: its name and its purpose."""
    width = max(len(benchmark.name) for benchmark in CATALOGUE)
    return "\n".join(f"{benchmark.name:<{width}}  {benchmark.purpose}" for benchmark in CATALOGUE)


def run(name: str, arguments: Sequence[str]) -> int:
    """Run the benchmark named as its module's ``__main__``, with ``arguments`` as its command line."""
    known = {benchmark.name: benchmark for benchmark in CATALOGUE}
    if name not in known:
        print(f"no benchmark named {name!r}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    module = known[name].module
    sys.argv = [f"python -m {module}", *arguments]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``list``, ``run NAME ...`` or ``all ...``; with nothing, the usage and the list."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    command = arguments.pop(0) if arguments else ""
    if command == "list":
        print(listing())
        return 0
    if command == "run" and arguments:
        return run(arguments[0], arguments[1:])
    if command == "all":
        return run("suite", arguments)
    print(f"{USAGE}\n\n{listing()}", file=sys.stderr)
    return 0 if command in ("", "-h", "--help") else 2


if __name__ == "__main__":
    sys.exit(main())
