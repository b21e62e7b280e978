"""Fixtures of the runner tests: a Bench (workspace + flow CLI) per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .support import Bench, OrphanReaper

_REAPER = OrphanReaper()


@pytest.fixture(scope="session", autouse=True)
def _orphan_reaper() -> None:
    _REAPER.start()


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    b = Bench(tmp_path)
    yield b
    b.close()
