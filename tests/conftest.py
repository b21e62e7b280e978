"""Fixtures shared by every test: an isolated environment, fresh workspaces (an open one,
or the path of one with short retry backoffs), programs, and managers reaped at teardown."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from manager.support import Managers, OrphanReaper, make_workspace

from httk_flow import fsio
from httk_flow.submit import Submitter
from httk_flow.workspace import Workspace

settings.register_profile(
    "default",
    deadline=None,
    max_examples=100,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("ci", deadline=None, max_examples=600)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No test sees the developer's workspace, and a test's filesystem never leaks."""
    monkeypatch.delenv("FLOW_WORKSPACE", raising=False)
    monkeypatch.delenv("FLOW_CRASH_AT", raising=False)
    previous = fsio.set_filesystem(fsio.FileSystem())
    yield
    fsio.set_filesystem(previous)


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Workspace]:
    workspace = Workspace.create(str(tmp_path / "ws"))
    yield workspace
    workspace.close()


@pytest.fixture
def program(tmp_path: Path) -> str:
    """An executable script outside the workspace."""
    path = tmp_path / "run.sh"
    path.write_text("#!/bin/sh\necho hello\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


@pytest.fixture
def submitter(ws: Workspace) -> Submitter:
    return Submitter(ws, actor="test-submit")


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
