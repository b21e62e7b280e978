"""The Slurm backend against a real (single-node, two-CPU) Slurm: `flow sbatch`, a real
walltime, `flow scale`, adoption by token after a crash, an unreachable controller, and
the pause after repeated failures. Every batch job a test submits is cancelled after it."""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path

import orjson
import pytest
from helpers import wait_for
from manager.support import Managers, all_jobs, committed, dump, flow, job, submit, write_script

from httk_flow.protocol.leases import read_managers
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace
from httk_flow.scale.allocations import AllocationStore, AllocPhase, Reconciler, ScaleSettings
from httk_flow.scale.backends.slurm import BACKEND

from .support import Cluster

pytestmark = pytest.mark.slurm

#: the first attempt sleeps far past the allocation; any later attempt succeeds at once
LONG = """
if [ "$(bump main)" -eq 1 ]; then
    touch "$FLOW_WORKDIR/started"
    sleep 300
fi
publish '{"action":"succeed"}'
"""


def counts(root: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for info in all_jobs(root):
        out[info.state.value] = out.get(info.state.value, 0) + 1
    return out


def log_text(root: str, token: str, job_id: str) -> str:
    path = Path(root) / ".flow" / "allocations" / "logs" / f"flow-{token}-{job_id}.out"
    return path.read_text(errors="replace") if path.exists() else f"(no log at {path})"


def test_flow_sbatch_runs_a_manager_that_finishes_the_queue_and_drains_on_term(
    root: str, scripts: Path, cluster: Cluster
) -> None:
    submit(root, write_script(scripts, "ok.sh", "exit 0\n"), 50)
    p = flow("sbatch", "-w", root, "--time", "10m", "--json", "--", "--lease", "10s")
    assert p.returncode == 0, p.stderr
    doc = orjson.loads(p.stdout)
    job_id, token = doc["job_id"], doc["token"]
    assert [str(j.id) for j in cluster.jobs(f"flow-{token}")] == [job_id]
    row = cluster.job(job_id)
    assert row["Comment"] == f"token={token}"

    wait_for(lambda: counts(root).get("succeeded") == 50, 120, 0.5)
    ws = Workspace.open(root)
    try:
        [manager] = read_managers(ws)
    finally:
        ws.close()
    assert manager.info.allocation == token  # the manager knows its allocation
    assert manager.info.ends_at is not None  # ... and, from the batch system, its end
    assert 0 < manager.info.ends_at - time.time() <= 600

    BACKEND.cancel(job_id)  # a running manager: `scancel -b -s TERM`, it drains
    assert cluster.wait_ended(job_id, 60) == "COMPLETED", log_text(root, token, job_id)
    assert cluster.job(job_id)["ExitCode"] == "0:0"
    log = log_text(root, token, job_id)
    assert "draining (signal SIGTERM)" in log, log
    assert "50 succeeded, 0 failed" in log, log


def test_the_walltime_signal_drains_the_manager_and_the_job_runs_again_uncharged(
    root: str, scripts: Path, cluster: Cluster, managers: Managers
) -> None:
    [jid] = submit(root, write_script(scripts, "long.sh", LONG))
    t0 = time.monotonic()
    p = flow("sbatch", "-w", root, "--time", "1m", "--drain", "10s", "--", "--kill-grace", "2s")
    assert p.returncode == 0, p.stderr
    job_id = p.stdout.strip()
    assert job_id.isdigit(), p.stdout
    [token] = [j.name.removeprefix("flow-") for j in cluster.since(int(job_id))]
    workdir = job(root, jid).job_dir(root) / "run"
    wait_for(lambda: (workdir / "started").exists(), 60, 0.2)

    # Slurm sends TERM (--signal=B:TERM@10) 20-50 s after the start: the manager drains
    state = cluster.wait_ended(job_id, 150)
    elapsed = time.monotonic() - t0
    log = log_text(root, token, job_id)
    assert state == "COMPLETED", f"{state} after {elapsed:.0f} s\n{log}"  # not TIMEOUT
    assert "draining (signal SIGTERM)" in log, log
    info = job(root, jid)
    assert info.state is State.READY, dump(root)
    assert info.last["why"] == "interrupted"
    assert info.last["try"] == 0  # the failure budget of the activation is intact
    assert info.last["result"]["interrupted"]  # our drain, not a failure

    assert managers.run(root) == 0  # a second manager finishes it
    info = job(root, jid)
    assert info.state is State.SUCCEEDED, dump(root)
    assert [why for _, _, why in committed(info)] == ["interrupted", "succeed"]


def test_flow_scale_keeps_at_most_max_allocations_and_ends_them_when_the_queue_is_empty(
    root: str, scripts: Path, cluster: Cluster
) -> None:
    submit(root, write_script(scripts, "ok.sh", "exit 0\n"), 200)
    first = cluster.next_job_id()
    scale = ["scale", "-w", root, "--backend", "slurm", "--max", "2"]
    scale += ["--jobs-per-manager", "100", "--once", "--time", "10m", "--serve-arg=--lease=6s"]
    peak, reports = 0, []
    deadline = time.monotonic() + 180
    while True:
        p = flow(*scale, "--json")
        assert p.returncode == 0, p.stderr
        reports.append(orjson.loads(p.stdout))
        live = [j for j in cluster.since(first) if j.live]
        peak = max(peak, len(live))
        ws = Workspace.open(root)
        try:
            records = AllocationStore(ws).load_all()
        finally:
            ws.close()
        done = counts(root).get("succeeded") == 200
        if done and not live and records and all(r.phase.ended for r in records):
            break
        assert time.monotonic() < deadline, (reports[-5:], records, counts(root), live)
        time.sleep(0.5)
    assert peak <= 2
    assert sum(len(r["submitted"]) for r in reports) == 2  # two were enough
    assert {r.phase for r in records} == {AllocPhase.CANCELLED}, records
    # the first manager may do all 200 jobs before the second allocation leaves the
    # queue: that one is then cancelled still pending, which is what ending them means
    assert any(r.ran for r in records), records
    assert len(cluster.since(first)) == 2


def test_a_submission_with_an_unknown_result_is_adopted_by_token_not_repeated(
    root: str, scripts: Path, cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a job that keeps its manager busy: the adopted allocation stays wanted
    submit(root, write_script(scripts, "long.sh", LONG))
    settings = ScaleSettings(max=1, jobs_per_manager=100, time=600.0)

    def crash(point: str) -> None:
        raise RuntimeError(f"crashed at {point}")

    ws = Workspace.open(root)
    try:
        with pytest.raises(RuntimeError, match="after_submit"):
            Reconciler(ws, BACKEND, settings, fault=crash).tick()
        [rec] = AllocationStore(ws).load_all()
        assert rec.phase is AllocPhase.REQUESTED and rec.handle is None
        [submitted] = cluster.jobs(f"flow-{rec.token}")

        # a controller that does not answer moves no state and submits nothing
        store = Path(ws.flow) / "allocations" / f"{rec.token}.json"
        before = store.read_bytes()
        monkeypatch.setenv("SLURM_CONF", unreachable_conf(tmp_path))
        report = Reconciler(ws, BACKEND, settings).tick()
        assert "Unable to contact slurm controller" in report.unavailable
        assert report.submitted == [] and report.adopted == []
        assert store.read_bytes() == before
        monkeypatch.delenv("SLURM_CONF")

        report = Reconciler(ws, BACKEND, settings).tick()
        assert report.adopted == [rec.token]
        assert report.submitted == []
        [rec] = AllocationStore(ws).load_all()
        assert rec.handle == str(submitted.id)
        assert rec.phase in (AllocPhase.PENDING, AllocPhase.RUNNING)
        assert [j.id for j in cluster.jobs(f"flow-{rec.token}")] == [submitted.id]
        assert len([j for j in cluster.since(submitted.id) if j.name.startswith("flow-")]) == 1
    finally:
        ws.close()


def unreachable_conf(tmp_path: Path) -> str:
    """A copy of the cluster's slurm.conf that points the clients at a closed port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    text = Path("/etc/slurm/slurm.conf").read_text()
    lines = [
        f"SlurmctldPort={port}" if ln.startswith("SlurmctldPort=") else ln
        for ln in text.splitlines()
    ]
    path = tmp_path / "unreachable.conf"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_repeated_refused_submissions_pause_the_queue_until_unpaused(
    root: str, scripts: Path, cluster: Cluster
) -> None:
    submit(root, write_script(scripts, "ok.sh", "exit 0\n"))
    first = cluster.next_job_id()
    bad = ScaleSettings(max=1, time=600.0, extra_args=("--partition=flow-none",), backoff_base=0)
    ws = Workspace.open(root)
    try:
        reports = [Reconciler(ws, BACKEND, bad).tick() for _ in range(5)]
        store = AllocationStore(ws)
        records = store.load_all()
        assert [r.phase for r in records] == [AllocPhase.FAILED] * 3
        assert all("invalid partition" in r.reason.lower() for r in records), records
        assert [len(r.submitted) for r in reports] == [1, 1, 1, 0, 0]
        assert reports[-1].paused and "flow scale --unpause" in reports[-1].paused
        assert store.paused() is not None
        assert cluster.since(first) == []

        # the operator fixes the cause and unpauses: the next pass submits again
        p = flow("scale", "-w", root, "--backend", "slurm", "--unpause", "--once", "--max", "1")
        assert p.returncode == 0, p.stderr
        assert "unpaused" in p.stdout
        assert store.paused() is None
        [live] = [j for j in cluster.since(first) if j.live]
        assert live.name.startswith("flow-")
    finally:
        ws.close()


def test_the_example_sbatch_script_runs_a_manager_that_drains(
    root: str, scripts: Path, cluster: Cluster, tmp_path: Path
) -> None:
    from .support import REPO, flow_env, run

    submit(root, write_script(scripts, "ok.sh", "exit 0\n"), 10)
    example = REPO / "examples" / "sbatch-manager.sh"
    if shutil.which("shellcheck"):
        check = run("shellcheck", "-x", str(example))
        assert check.returncode == 0, check.stdout
    out = tmp_path / "manager.out"
    # the command line overrides the script's #SBATCH lines (this node has 2 CPUs)
    argv = ["sbatch", "--parsable", "--time=5", "--cpus-per-task=1", f"--output={out}"]
    argv += [str(example), root]
    p = run(*argv, "--lease", "10s", env=flow_env())  # the job finds `flow` on PATH
    assert p.returncode == 0, p.stderr
    job_id = p.stdout.strip().split(";")[0]
    wait_for(lambda: counts(root).get("succeeded") == 10, 90, 0.5)
    cluster.signal_drain(job_id)
    assert cluster.wait_ended(job_id, 60) == "COMPLETED", out.read_text()
    assert cluster.job(job_id)["ExitCode"] == "0:0"
    assert "draining (signal SIGTERM)" in out.read_text()
