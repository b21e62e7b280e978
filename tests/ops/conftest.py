"""Fixtures of the operator tests: a workspace made by `flow init`, `flow` on it, managers."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from .support import Flow, patch_policy


@pytest.fixture
def root(initialised: str) -> str:
    """A fresh workspace (its path) whose retries back off for 0.2 s, doubling to 2 s."""
    patch_policy(initialised, backoff_base=0.2, backoff_cap=2.0)
    return initialised


@pytest.fixture
def flow(root: str, runner: CliRunner) -> Flow:
    return Flow(root, runner)
