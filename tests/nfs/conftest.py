"""Fixtures of the NFS-model tests: a workspace and managers (the model itself is installed
by each test with fsio.set_filesystem; the autouse fixture of tests/conftest.py removes it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from manager.support import Managers, OrphanReaper, make_workspace


@pytest.fixture
def root(tmp_path: Path) -> str:
    return make_workspace(tmp_path / "ws")


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    return tmp_path / "scripts"


@pytest.fixture
def managers(tmp_path: Path) -> Iterator[Managers]:
    with OrphanReaper():
        m = Managers(tmp_path)
        try:
            yield m
        finally:
            m.close()
