"""Fixtures of the Slurm tests: the local cluster (started once per session; a cluster
that does not start fails the tests, it never skips them), a workspace, and cleanup of
every batch job a test submitted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from manager.support import Managers, OrphanReaper, make_workspace

from .support import Cluster, start_cluster


@pytest.fixture(scope="session")
def slurm_cluster() -> Cluster:
    return start_cluster()


@pytest.fixture(autouse=True)
def _cluster_for_slurm_tests(request: pytest.FixtureRequest) -> Iterator[Cluster | None]:
    """Tests marked `slurm` get the cluster, and lose every job they submitted."""
    if request.node.get_closest_marker("slurm") is None:
        yield None
        return
    cluster: Cluster = request.getfixturevalue("slurm_cluster")
    first = cluster.next_job_id()
    try:
        yield cluster
    finally:
        cluster.cancel_since(first)


@pytest.fixture
def cluster(_cluster_for_slurm_tests: Cluster | None) -> Cluster:
    assert _cluster_for_slurm_tests is not None, "mark the test with @pytest.mark.slurm"
    return _cluster_for_slurm_tests


@pytest.fixture
def root(tmp_path: Path) -> str:
    return make_workspace(tmp_path / "ws")


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    return tmp_path / "scripts"


@pytest.fixture
def managers(tmp_path: Path) -> Iterator[Managers]:
    """Local managers (`flow run`), killed with their attempts at teardown."""
    with OrphanReaper():
        m = Managers(tmp_path)
        try:
            yield m
        finally:
            m.close()
