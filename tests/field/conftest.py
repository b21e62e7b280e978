"""Fixtures of the field tests: the local Slurm cluster (started once per session, as for
tests/slurm; a cluster that does not start fails the test) and the simulation code."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from slurm.support import Cluster, start_cluster

#: Debian's quantum-espresso-data puts the pseudopotentials here
PSEUDO_DIR = Path("/usr/share/espresso/pseudo")
PSEUDO = "Si.pz-vbc.UPF"


@pytest.fixture(scope="session")
def field_cluster() -> Cluster:
    return start_cluster()


@pytest.fixture(scope="session")
def pwx() -> str:
    """The path of pw.x. Missing under CI (which installs it) fails; elsewhere skips."""
    exe = shutil.which("pw.x")
    missing = []
    if exe is None:
        missing.append("pw.x (Debian package quantum-espresso)")
    if not (PSEUDO_DIR / PSEUDO).is_file():
        missing.append(f"{PSEUDO_DIR / PSEUDO} (Debian package quantum-espresso-data)")
    if missing:
        why = "the field test needs " + " and ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(f"{why}: .ci/run installs them with apt-get")
        pytest.skip(f"{why}: apt-get install quantum-espresso quantum-espresso-data")
    assert exe is not None
    return exe
