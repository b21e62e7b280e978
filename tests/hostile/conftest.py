"""Fixtures of the hostile-input tests: a workspace, managers, a sentinel directory outside
the workspace, and a summary of how many inputs hypothesis handed each parser."""

from __future__ import annotations

from pathlib import Path

import pytest

from .tally import TRIED


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside (not inside) the workspace: nothing may be written to it."""
    d = tmp_path / "outside"
    d.mkdir()
    return d


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TRIED:
        return
    terminalreporter.section("hypothesis inputs tried per parser")
    for name, n in sorted(TRIED.items()):
        terminalreporter.write_line(f"{name:<44} {n:>6}")
    terminalreporter.write_line(f"{'total':<44} {sum(TRIED.values()):>6}")
