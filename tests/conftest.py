"""Fixtures shared by every test: an isolated environment, fresh workspaces (an open one,
the path of one with short retry backoffs, or of one made by `flow init`), click's runner,
programs, and managers reaped at teardown."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, settings
from manager.support import Managers, OrphanReaper, make_workspace

from httk_flow.cli.main import cli
from httk_flow.protocol import fsio
from httk_flow.protocol.submit import Submitter
from httk_flow.protocol.workspace import Workspace

settings.register_profile(
    "default",
    deadline=None,
    max_examples=100,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("ci", deadline=None, max_examples=600)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def _slurm_unavailable() -> str | None:
    """Why the local Slurm cannot be started here (None: it can, or CI must)."""
    if os.environ.get("CI"):
        return None  # CI starts the cluster: a Slurm test that cannot run fails there
    if os.geteuid() != 0:
        return "starting the local Slurm needs root"
    if not (shutil.which("slurmctld") or shutil.which("apt-get")):
        return "the local Slurm needs Debian's slurm-wlm (apt-get not found)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    why = _slurm_unavailable()
    if why is None:
        return
    slurm = [i for i in items if i.get_closest_marker("slurm") is not None]
    if not slurm:
        return
    items[:] = [i for i in items if i.get_closest_marker("slurm") is None]
    config.hook.pytest_deselected(items=slurm)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    line = (
        f"deselected {len(slurm)} Slurm test(s): {why}; run them as root on Debian "
        "(`sudo python3 -m pytest -m slurm`, which starts tests/slurm/cluster), or `bash .ci/run`"
    )
    if reporter is not None:
        reporter.write_line(line)


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
def flat_ws(tmp_path: Path) -> Iterator[Workspace]:
    """A workspace that keeps every ready marker in its placement's directory (made with
    --no-class-dirs, or by httk_flow before protocol revision 8)."""
    workspace = Workspace.create(str(tmp_path / "ws"), class_dirs=False)
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
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    """click's runner for `flow` in this process: colour off, at a fixed width."""
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "120")
    return CliRunner()


@pytest.fixture
def initialised(runner: CliRunner, tmp_path: Path) -> str:
    """A fresh workspace (its path) made by `flow init`, with the policy it writes."""
    path = str(tmp_path / "ws")
    r = runner.invoke(cli, ["init", path])
    assert r.exit_code == 0, r.output
    return path


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
