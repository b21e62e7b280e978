"""Fixtures of the NFS-model tests: a workspace, managers, and discovery routed through the
installed FileSystem for the duration of a test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from manager.support import Managers, OrphanReaper, make_workspace

from .faultfs import route_discovery_through_fs


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


@pytest.fixture
def routed() -> Iterator[None]:
    """Discovery lists through `fs` (it bypasses the seam; see test_seam.py)."""
    route_discovery_through_fs()
    yield
    route_discovery_through_fs(False)
