"""The docs' commands run: every ``cleanup-worker ...`` line in docs/ and the README, and every example at the end of
a command's ``--help``, parses with the command line as it is (``--help``-level: the sub-command exists, each option
is known, nothing is left over), and every repository path it names exists. Beside them: the install section installs
from a clone or a built wheel (no index holds the project), a section a message or a page cites by name exists, the
metric reference names every kind an Action dimension can take, and an exit code the docs promise is the one given.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cleanup.actions.loading import BUILT_IN
from cleanup.telemetry import METRICS
from worker import cli, shared_options

ROOT = Path(__file__).resolve().parents[1]
PAGES = [*sorted(ROOT.glob("docs/**/*.md")), ROOT / "README.md"]
TOP = {path.name for path in ROOT.iterdir() if not path.name.startswith(".")}
PLACEHOLDER = "PLACEHOLDER"


def code_spans(text: str) -> Iterator[str]:
    """The page's commands: each line of a fenced block (only its ``$ `` lines when it shows a session), backslash
    continuations joined, and each inline code span."""
    fenced = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
    for block in fenced.findall(text):
        lines = block.replace("\\\n", " ").splitlines()
        prompted = [line[2:] for line in lines if line.startswith("$ ")]
        yield from prompted or lines
    yield from re.findall(r"`([^`\n]+)`", fenced.sub("", text))


def commands(line: str) -> Iterator[str]:
    """Each ``cleanup-worker ...`` command in a line of shell, up to where the shell ends it."""
    line = re.sub(r"\$\((?:[^()]|\([^()]*\))*\)", PLACEHOLDER, line)  # $(...) gives one word
    line = re.sub(r"<[^<>]+>", PLACEHOLDER, line)  # <SomeOutput output>: a value to fill in
    for found in re.finditer(r"(?:^|[\s(])cleanup-worker(\s[^;|&#)]*)?", line):
        command = found.group(0).strip(" (")
        if "[-h]" not in command and not command.endswith(" COMMAND"):  # a usage synopsis (reference/cli.md)
            yield command


def documented() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for span in code_spans(page.read_text()):
            found += [(f"{page.relative_to(ROOT)}", command) for command in commands(span)]
    for name, examples in shared_options.EXAMPLES.items():
        for example in examples:
            found += [(f"cleanup-worker {name} --help", command) for command in commands(example)]
    return found


def repository_paths(command: str) -> list[str]:
    """The words of a command that name a path in this repository (a file users make themselves has no folder)."""
    words = shlex.split(command)
    return [word for word in words if "/" in word and word.split("/", 1)[0] in TOP and "://" not in word]


DOCUMENTED = documented()


def test_the_scan_finds_the_docs_commands() -> None:
    found = {command.split()[1] for _, command in DOCUMENTED if len(command.split()) > 1}
    assert set(cli.COMMANDS) - {"health"} <= found | {"kcl"}, set(cli.COMMANDS) - found
    assert len(DOCUMENTED) > 60


# A command named in prose (`cleanup-worker run`) leaves out what it requires: that is not a wrong line.
REQUIRED = re.compile(r"the following arguments are required|one of the arguments .* is required")


@pytest.mark.parametrize(("where", "command"), DOCUMENTED, ids=[f"{w}: {c[:60]}" for w, c in DOCUMENTED])
def test_each_documented_command_parses_and_names_only_paths_that_exist(
    where: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = shlex.split(command)[1:]
    if not argv:
        return  # the tool named, no command
    name = next((word for word in argv if not word.startswith("-")), None)
    parser = cli.build_parser(name if name in cli.COMMANDS else None)
    try:
        _, unknown = parser.parse_known_args(argv)
    except SystemExit as exit_:
        error = capsys.readouterr().err
        assert exit_.code == 0 or REQUIRED.search(error), f"{where}: {command!r} does not parse: {error}"
        unknown = []

    assert unknown == [], f"{where}: {command!r}: unknown {unknown}"
    for path in repository_paths(command):
        assert (ROOT / path).exists(), f"{where}: {command!r} names {path}, which does not exist"


def test_the_install_section_installs_from_a_clone_or_a_wheel_and_claims_no_index() -> None:
    # No package index holds the project: every pip install of it names a path (a clone, a built wheel).
    installs = [
        (page.name, line)
        for page in PAGES
        for span in code_spans(page.read_text())
        for line in span.splitlines()
        if re.search(r"pip install\b.*session-cleanup-worker|pip install '?session-cleanup-worker", line)
    ]
    for page, line in installs:
        target = line.split("pip install", 1)[1].split("#")[0]
        assert re.search(r"(^|\s)'?(\.|\./|dist/|/)", target), f"{page}: {line!r} installs from an index"
    index = (ROOT / "docs" / "index.md").read_text()
    assert "git clone" in index and "dist/session_cleanup_worker-" in index


def headings(page: Path) -> set[str]:
    return {line.lstrip("#").strip() for line in page.read_text().splitlines() if line.startswith("#")}


def cited_sections() -> list[tuple[str, str, str]]:
    """Every "(docs/<page>.md, '<section>')" or "(README, '<section>')" a page or the code cites."""
    sources = [*PAGES, *ROOT.glob("cleanup/**/*.py"), *ROOT.glob("worker/**/*.py"), ROOT / "deploy" / "template.yaml"]
    pattern = re.compile(r"\((README|docs/[\w./-]+\.md), ['\"]([^'\"]+)['\"]\)")
    return [(str(path.relative_to(ROOT)), *match) for path in sources for match in pattern.findall(path.read_text())]


@pytest.mark.parametrize(("where", "page", "section"), cited_sections())
def test_each_cited_section_exists(where: str, page: str, section: str) -> None:
    target = ROOT / ("README.md" if page == "README" else page)

    assert target.exists() and section in headings(target), f"{where} cites {page}, {section!r}: no such section"


def test_the_action_dimension_is_documented_with_every_kind() -> None:
    [failures] = [metric for metric in METRICS if metric.name == "ActionFailures"]

    assert all(kind in failures.dimension for kind in BUILT_IN), failures.dimension
    operate = (ROOT / "docs" / "operate.md").read_text()
    [row] = [line for line in operate.splitlines() if line.startswith("| `ActionFailuresAlarm`")]
    assert "every" in row and all(kind in row for kind in BUILT_IN), row


def test_replay_exits_2_for_an_unknown_table_as_documented(
    worker_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # docs/operate.md, "The command line": exit 2 for "an unknown queue or table".
    assert "an unknown queue or table" in (ROOT / "docs" / "operate.md").read_text()
    monkeypatch.setenv("SESSION_TABLE", "no-such-table")
    event = json.loads((ROOT / "events" / "lambda-dynamodb-explicit-remove.json").read_text())
    for record in event["Records"]:
        record["eventSourceARN"] = "arn:aws:dynamodb:us-east-1:123456789012:table/no-such-table/stream/1"
    path = tmp_path / "event.json"
    path.write_text(json.dumps(event))

    assert cli.main(["replay", str(path)]) == 2


GLOBAL_OPTIONS = {"--query", "--output", "--region", "--profile", "--endpoint-url", "--no-cli-pager"}


def aws_commands() -> list[tuple[str, str]]:
    """Each ``aws <service> <operation> ...`` line of the docs (not the CLI's own s3 commands)."""
    found = []
    for page in PAGES:
        for span in code_spans(page.read_text()):
            span = re.sub(r"\$\((?:[^()]|\([^()]*\))*\)", PLACEHOLDER, span)
            span = re.sub(r"<[^<>]+>", PLACEHOLDER, span)
            for match in re.finditer(r"(?:^|[\s(])(aws [a-z0-9-]+ [a-z0-9-]+(?:\s[^;|&#)]*)?)", span):
                if match.group(1).split()[1] not in ("s3", "cloudformation"):  # high-level s3; describe-stacks
                    found.append((page.name, match.group(1).strip()))
    return found


@pytest.mark.parametrize(("where", "command"), aws_commands(), ids=[c[:70] for _, c in aws_commands()])
def test_each_aws_cli_line_names_an_operation_and_options_it_has(where: str, command: str) -> None:
    import botocore.session

    words = command.split()  # the options' names are what is checked: a quoted JSON value may span lines
    service, operation = {"s3api": "s3"}.get(words[1], words[1]), words[2]
    model = botocore.session.get_session().get_service_model(service)
    names = {re.sub(r"(?<!^)(?=[A-Z])", "-", op).lower(): op for op in model.operation_names}
    assert operation in names, f"{where}: {command!r}: no operation {operation}"
    members = {
        re.sub(r"(?<!^)(?=[A-Z][a-z])", "-", m).lower()
        for m in model.operation_model(names[operation]).input_shape.members
    }
    for option in (word for word in words[3:] if word.startswith("--") and word not in GLOBAL_OPTIONS):
        name = option[2:].split("=", 1)[0]
        assert name.removeprefix("no-") in members, f"{where}: {command!r}: {option} is not an input of {operation}"
