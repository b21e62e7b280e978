"""A bad line of `flow submit --from` is named by file, line and column, and nothing of
the file is submitted."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from httk_flow.cli.main import cli


def nothing_submitted(runner: CliRunner, ws: str) -> bool:
    listed = runner.invoke(cli, ["-w", ws, "list", "--json"])
    return listed.exit_code == 0 and '"jobs": []' in listed.stdout


def test_a_line_that_is_not_json_is_named_by_file_line_and_column(
    runner: CliRunner, ws: str, tmp_path: Path
) -> None:
    f = tmp_path / "jobs.jsonl"
    f.write_text('{"name": "a"}\n\n{"name": "b",, }\n')
    r = runner.invoke(cli, ["-w", ws, "submit", "--from", str(f), "true"])
    assert r.exit_code == 2
    assert r.stderr == (
        f"flow: error: {f}:3, column 14: is not valid JSON: unexpected character, expected a "
        "string key; each line of the file is one JSON object\n"
    )
    assert nothing_submitted(runner, ws)


def test_every_bad_line_of_a_file_is_named_in_one_run(
    runner: CliRunner, ws: str, tmp_path: Path
) -> None:
    f = tmp_path / "jobs.jsonl"
    f.write_text(
        '{"name": "a"}\n'
        '{"name": "b", "parms": {"n": 2}}\n'
        "[1, 2]\n"
        "\n"
        '{"name": "c", "cpus": "two"}\n'
        '{"name": "d", "program": "./nowhere.sh"}\n'
        '{"name": "e"}\n'
    )
    r = runner.invoke(cli, ["-w", ws, "submit", "--from", str(f), "true"])
    assert r.exit_code == 2
    assert r.stderr == (
        f"flow: error: {f}: 4 lines are not valid jobs; nothing was submitted:\n"
        f"  {f}:2: has unknown key(s) parms; allowed: after after_policy args bundle cpus gpus "
        "group hold in_place inputs max_attempts mem name params placement pool priority "
        "program require_outcome requires resources retries step tag time time_limit "
        "time_limit_factor workdir\n"
        f"  {f}:3: is not a JSON object\n"
        f"  {f}:5: cpus: must be a whole number\n"
        f"  {f}:6: program './nowhere.sh': cannot be read (No such file or directory)\n"
    )
    assert nothing_submitted(runner, ws)


def test_a_file_of_many_bad_lines_lists_the_first_twenty_and_counts_the_rest(
    runner: CliRunner, ws: str, tmp_path: Path
) -> None:
    f = tmp_path / "jobs.jsonl"
    f.write_text("".join(f'{{"name": "j{i}", "priority": 1000}}\n' for i in range(1, 1026)))
    r = runner.invoke(cli, ["-w", ws, "submit", "--from", str(f), "true"])
    assert r.exit_code == 2
    lines = r.stderr.splitlines()
    assert lines[0] == f"flow: error: {f}: 1,025 lines are not valid jobs; nothing was submitted:"
    assert lines[1:] == [
        *(f"  {f}:{i}: priority: priority 1000 is outside 0-999" for i in range(1, 21)),
        "  ... and 1,005 more",
    ]
