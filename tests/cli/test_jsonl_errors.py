"""A bad line of `flow submit --from` is named by file, line and column, and nothing of
the file is submitted."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from httk_flow.cli.main import cli


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
    listed = runner.invoke(cli, ["-w", ws, "list", "--json"])
    assert listed.exit_code == 0 and '"jobs": []' in listed.stdout
