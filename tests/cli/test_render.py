"""The one renderer of the CLI: errors, warnings, JSON documents and tables."""

from __future__ import annotations

import errno

import orjson
import pytest
from click.testing import CliRunner

from httk_flow.cli.main import cli
from httk_flow.ops import lookup


def test_a_flow_error_is_one_line_with_its_exit_status(runner: CliRunner, ws: str) -> None:
    r = runner.invoke(cli, ["show", "-w", ws, "nosuchjob1"])
    assert r.exit_code == 2
    assert r.stdout == ""
    [line] = r.stderr.splitlines()
    assert line.startswith("flow: error: ")


def test_the_machine_refusing_is_an_error_line_not_a_traceback(
    runner: CliRunner, ws: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*_a: object, **_k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "/ws/.flow/x")

    monkeypatch.setattr("httk_flow.protocol.maintenance.acquire", full)
    r = runner.invoke(cli, ["lock", "-w", ws])
    assert r.exit_code == 1
    assert r.stderr == (
        "flow: error: /ws/.flow/x: No space left on device; free space or fix permissions "
        "in the workspace and run the command again\n"
    )


def test_anything_else_is_a_bug_and_keeps_its_traceback(
    runner: CliRunner, ws: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_a: object, **_k: object) -> None:
        raise KeyError("bug")

    monkeypatch.setattr(lookup, "list_rows", broken)
    r = runner.invoke(cli, ["list", "-w", ws])
    assert isinstance(r.exception, KeyError)
    assert "flow: error" not in r.stderr


def test_one_refusal_among_many_is_reported_and_the_rest_applied(
    runner: CliRunner, ws: str
) -> None:
    a, b = (runner.invoke(cli, ["submit", "-w", ws, "/bin/true"]).stdout.strip() for _ in "ab")
    runner.invoke(cli, ["cancel", "-w", ws, a])
    # a cancelled job has no priority to change; one not yet registered has
    r = runner.invoke(cli, ["priority", "-w", ws, a, b, "5"])
    assert r.exit_code == 2
    assert r.stdout == f"{b}: submitted -> submitted (priority 5)\n"
    assert r.stderr.startswith("flow: error: ") and len(r.stderr.splitlines()) == 1


def test_json_is_one_indented_document_and_nothing_else(runner: CliRunner, ws: str) -> None:
    r = runner.invoke(cli, ["submit", "-w", ws, "--json", "/bin/true"])
    assert r.exit_code == 0
    doc = orjson.loads(r.stdout)
    assert r.stdout == orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"


def test_a_table_off_a_terminal_is_plain_aligned_columns(runner: CliRunner, ws: str) -> None:
    runner.invoke(cli, ["submit", "-w", ws, "--tag", "t1", "/bin/true"])
    r = runner.invoke(cli, ["list", "-w", ws])
    header, row = r.stdout.splitlines()
    assert header.split() == [
        "ID",
        "TAG",
        "STATE",
        "STEP",
        "PRIO",
        "ATTEMPTS",
        "ELAPSED",
        "LIMIT",
        "PLACEMENT",
    ]
    assert header.index("TAG") == row.index("t1")
    assert "\x1b[" not in r.stdout and not any(line != line.rstrip() for line in [header, row])
