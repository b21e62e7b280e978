"""Fixtures of the Slurm tests: the local cluster (started once per session; a cluster
that does not start fails the tests, it never skips them), a workspace, and cleanup of
every batch job a test submitted."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .support import Cluster, start_cluster


@pytest.fixture(scope="session")
def slurm_cluster() -> Cluster:
    return start_cluster()


@pytest.fixture(autouse=True)
def _cluster_for_slurm_tests(request: pytest.FixtureRequest) -> Iterator[Cluster | None]:
    """Tests marked `slurm` get the cluster, and lose every job they submitted (those
    that run or write in the test's own directory: nobody else's)."""
    if request.node.get_closest_marker("slurm") is None:
        yield None
        return
    cluster: Cluster = request.getfixturevalue("slurm_cluster")
    # the test's own directory: its workspaces, scripts and batch logs live there
    root = str(request.getfixturevalue("tmp_path"))
    first = cluster.next_job_id()
    try:
        yield cluster
    finally:
        cluster.cancel_since(first, root)


@pytest.fixture
def cluster(_cluster_for_slurm_tests: Cluster | None) -> Cluster:
    assert _cluster_for_slurm_tests is not None, "mark the test with @pytest.mark.slurm"
    return _cluster_for_slurm_tests
