"""Fixtures of the CLI tests: a fresh workspace (its path) made through the CLI itself
(tests/conftest.py gives click's runner, colour off at a fixed width)."""

from __future__ import annotations

import pytest


@pytest.fixture
def ws(initialised: str) -> str:
    return initialised
