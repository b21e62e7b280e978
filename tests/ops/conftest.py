"""Fixtures of the operator tests: a workspace made by `flow init`, `flow` on it, managers."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from httk_flow.cli.main import cli

from .support import Flow, patch_policy


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "120")
    return CliRunner()


@pytest.fixture
def root(runner: CliRunner, tmp_path: Path) -> str:
    """A fresh workspace (its path) whose retries back off for 0.2 s, doubling to 2 s."""
    path = str(tmp_path / "ws")
    r = runner.invoke(cli, ["init", path])
    assert r.exit_code == 0, r.output
    patch_policy(path, backoff_base=0.2, backoff_cap=2.0)
    return path


@pytest.fixture
def flow(root: str, runner: CliRunner) -> Flow:
    return Flow(root, runner)
