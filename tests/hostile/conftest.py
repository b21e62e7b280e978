"""Fixtures of the hostile-input tests: a workspace, managers, a sentinel directory outside
the workspace, and a summary of how many inputs hypothesis handed each parser."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from manager.support import Managers, OrphanReaper, make_workspace

from .tally import TRIED


@pytest.fixture
def root(tmp_path: Path) -> str:
    """A fresh workspace (its path) whose retries back off for 0.2 s, doubling to 2 s."""
    return make_workspace(tmp_path / "ws")


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    return tmp_path / "scripts"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside (not inside) the workspace: nothing may be written to it."""
    d = tmp_path / "outside"
    d.mkdir()
    return d


@pytest.fixture
def managers(tmp_path: Path) -> Iterator[Managers]:
    """Starts managers; at teardown kills what is left of them and reaps their orphans."""
    with OrphanReaper():
        m = Managers(tmp_path)
        try:
            yield m
        finally:
            m.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TRIED:
        return
    terminalreporter.section("hypothesis inputs tried per parser")
    for name, n in sorted(TRIED.items()):
        terminalreporter.write_line(f"{name:<44} {n:>6}")
    terminalreporter.write_line(f"{'total':<44} {sum(TRIED.values()):>6}")
