"""The own-costs benchmark's invocations: when records fail, the error quotes what the handler logged about them."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.own_costs import complaints


def test_complaints_quote_the_handlers_warnings_and_errors_only(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    lines = [
        {"level": "INFO", "message": "batch started"},
        "not json: a print from a library",
        {"level": "ERROR", "message": "record 42 failed", "sequenceNumber": "42"},
        {"level": "WARNING", "message": "throttled"},
    ]
    log.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    quoted = complaints(str(log)).splitlines()
    assert [json.loads(line)["message"] for line in quoted] == ["record 42 failed", "throttled"]


def test_complaints_say_so_when_nothing_was_logged_at_warning(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"level": "INFO", "message": "batch started"}) + "\n")
    assert complaints(str(log)) == "(nothing at WARNING or above)"


def test_complaints_keep_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"level": "ERROR", "message": str(n)}) + "\n" for n in range(30)))
    quoted = complaints(str(log), most=3).splitlines()
    assert [json.loads(line)["message"] for line in quoted] == ["27", "28", "29"]
