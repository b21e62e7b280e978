"""Helpers of the Slurm tests: start the local cluster, look at its queue, clean it up."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from httk_flow.protocol.workspace import Workspace
from httk_flow.scale.allocations import AllocationStore

REPO = Path(__file__).resolve().parents[2]
#: where the cluster scripts live: beside this file (the project carries them), or where
#: LOCAL_SLURM_SCRIPTS says
SCRIPT_DIRS = tuple(
    Path(p)
    for p in (os.environ.get("LOCAL_SLURM_SCRIPTS"), Path(__file__).resolve().parent / "cluster")
    if p
)
#: job states of a job that still holds (or waits for) its allocation; SIGNALING is shown
#: while Slurm delivers a signal (its walltime TERM among them), before the job ends
LIVE = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SIGNALING",
        "STAGE_OUT",
        "SUSPENDED",
        "REQUEUED",
        "RESIZING",
    }
)


def script_dir() -> Path:
    for d in SCRIPT_DIRS:
        if (d / "start-local-slurm.sh").is_file():
            return d
    pytest.fail(f"no start-local-slurm.sh in {' or '.join(str(d) for d in SCRIPT_DIRS)}")


def start_cluster() -> Cluster:
    """Start (or confirm) the local cluster; a cluster that does not start fails the test."""
    script = script_dir() / "start-local-slurm.sh"
    try:
        p = subprocess.run(
            ["bash", str(script)], capture_output=True, text=True, timeout=600, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{script} did not finish within 600 s")
    if p.returncode != 0:
        pytest.fail(f"the local Slurm cluster did not start ({script}):\n{p.stdout}\n{p.stderr}")
    return Cluster()


def run(
    *argv: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, check=False, env=env
    )


@dataclass(frozen=True)
class Job:
    id: int
    state: str
    name: str
    workdir: str = ""
    stdout: str = ""

    def under(self, root: str) -> bool:
        """Whether the job runs or writes in `root` (a test's own directory)."""
        top = os.path.join(os.path.realpath(root), "")
        return any(os.path.realpath(p).startswith(top) for p in (self.workdir, self.stdout) if p)

    @property
    def live(self) -> bool:
        return self.state in LIVE


class Cluster:
    """The queue as the tests see it (through the real client commands)."""

    def jobs(self, name: str | None = None) -> list[Job]:
        argv = ["squeue", "-h", "-t", "all", "-o", "%i|%T|%Z|%o|%j"]
        if name:
            argv += ["--name", name]
        p = run(*argv)
        assert p.returncode == 0, p.stderr
        out = []
        for line in p.stdout.splitlines():
            job_id, state, workdir, stdout, job_name = line.strip().split("|", 4)
            out.append(Job(int(job_id), state, job_name, workdir, stdout))
        return sorted(out, key=lambda j: j.id)

    def next_job_id(self) -> int:
        return max((j.id for j in self.jobs()), default=0) + 1

    def since(self, first: int) -> list[Job]:
        return [j for j in self.jobs() if j.id >= first and j.name != "local-slurm-smoke"]

    def job(self, job_id: str | int) -> dict[str, str]:
        """`scontrol show job -o` as a dict (JobState, ExitCode, ...)."""
        p = run("scontrol", "show", "job", "-o", str(job_id))
        assert p.returncode == 0, p.stderr
        fields = {}
        for word in p.stdout.split():
            key, _, value = word.partition("=")
            fields.setdefault(key, value)
        return fields

    def state(self, job_id: str | int) -> str:
        return self.job(job_id)["JobState"]

    def wait_ended(self, job_id: str | int, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            st = self.state(job_id)
            if st not in LIVE:
                return st
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} still {st} after {timeout} s")
            time.sleep(0.5)

    def signal_drain(self, job_id: str | int) -> None:
        p = run("scancel", "-b", "-s", "TERM", str(job_id))
        assert p.returncode == 0, p.stderr

    def cancel_since(self, first: int, root: str, timeout: float = 90) -> None:
        """Cancel every job submitted since `first` that runs or writes under `root` (the
        test's own directory: other work on the cluster is left alone), and wait until
        none of them holds a node."""

        def mine() -> list[Job]:
            return [j for j in self.since(first) if j.live and j.under(root)]

        live = mine()
        if live:
            run("scancel", *[str(j.id) for j in live])
        deadline = time.monotonic() + timeout
        while mine() and time.monotonic() < deadline:
            time.sleep(0.5)


def tokens(root: str) -> list[str]:
    """Tokens of the workspace's allocation records, oldest first."""
    ws = Workspace.open(root)
    try:
        return [r.token for r in AllocationStore(ws).load_all()]
    finally:
        ws.close()


def flow_env() -> dict[str, str]:
    """The environment for batch jobs that call `flow`: this interpreter's bin first."""
    env = dict(os.environ)
    bindir = os.path.dirname(sys.executable)
    env["PATH"] = f"{bindir}:{env.get('PATH', '')}"
    return env
