"""Fixtures of the operator tests: a workspace made by `flow init`, `flow` on it, managers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from manager.support import Managers, OrphanReaper

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


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    return tmp_path / "scripts"


@pytest.fixture
def managers(tmp_path: Path) -> Iterator[Managers]:
    """Starts managers; at teardown kills what is left of them and reaps their orphans."""
    with OrphanReaper():
        m = Managers(tmp_path)
        try:
            yield m
        finally:
            m.close()
