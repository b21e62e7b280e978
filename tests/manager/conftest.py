"""Fixtures of the manager tests: a workspace with a short backoff, and managers to run on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .support import Managers, OrphanReaper, make_workspace


@pytest.fixture
def root(tmp_path: Path) -> str:
    """A fresh workspace (its path) whose retries back off for 0.2 s, doubling to 2 s."""
    return make_workspace(tmp_path / "ws")


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
