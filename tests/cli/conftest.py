"""Fixtures of the CLI tests: click's runner with colour off at a fixed width, and a
fresh workspace (its path) made through the CLI itself."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from httk_flow.cli.main import cli


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.delenv("FLOW_WORKSPACE", raising=False)
    return CliRunner()


@pytest.fixture
def ws(runner: CliRunner, tmp_path: Path) -> str:
    path = str(tmp_path / "ws")
    r = runner.invoke(cli, ["init", path])
    assert r.exit_code == 0, r.output
    return path
