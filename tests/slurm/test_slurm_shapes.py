"""Shaped allocations against a real (single-node, two-CPU) Slurm: `flow scale` asks for
the CPUs and memory of the queued jobs and Slurm grants them (`scontrol show job`), a
mixed campaign of one- and two-CPU jobs finishes within --max allocations, and the
managers of an allocation of several nodes, started as one srun step, drain when the
batch shell is told to. Every batch job a test submits is cancelled after it."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import orjson
import pytest
from helpers import wait_for
from manager.support import all_jobs, dump, flow, job, submit, write_script

from httk_flow.protocol import layout
from httk_flow.protocol.resources import Request
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace
from httk_flow.scale.allocations import AllocationStore, AllocPhase
from httk_flow.scale.backends.base import AllocationProfile, AllocationRequest, Outcome
from httk_flow.scale.backends.slurm import BACKEND

from .support import Cluster, run

pytestmark = pytest.mark.slurm

M = 1 << 20

#: the first attempt sleeps far past the test; any later attempt succeeds at once
LONG = """
if [ "$(bump main)" -eq 1 ]; then
    touch "$FLOW_WORKDIR/started"
    sleep 300
fi
publish '{"action":"succeed"}'
"""


def real_memory() -> int:
    """The node's RealMemory in megabytes, as the controller has it."""
    p = run("scontrol", "show", "node", "-o")
    assert p.returncode == 0, p.stderr
    fields = dict(w.partition("=")[::2] for w in p.stdout.split())
    return int(fields["RealMemory"])


def counts(root: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for info in all_jobs(root):
        out[info.state.value] = out.get(info.state.value, 0) + 1
    return out


def log_text(root: str, token: str, job_id: str) -> str:
    path = Path(layout.allocation_logs(root)) / f"flow-{token}-{job_id}.out"
    return path.read_text(errors="replace") if path.exists() else f"(no log at {path})"


def test_flow_scale_asks_for_the_shape_of_the_queued_jobs_and_a_mixed_campaign_finishes(
    root: str, scripts: Path, cluster: Cluster
) -> None:
    ok = write_script(scripts, "ok.sh", "sleep 2\nexit 0\n")
    submit(root, ok, 1, resources=Request(cpus=1, mem=100 * M))
    submit(root, ok, 2, resources=Request(cpus=2, mem=300 * M))
    limit = min(2048, real_memory() // 2)  # below what the node has
    first = cluster.next_job_id()
    scale = ["scale", "-w", root, "--backend", "slurm", "--once", "--json", "--max", "2"]
    scale += ["--cpus-per-node", "2", "--mem-per-node", f"{limit}M", "--time", "5m"]
    scale += ["--drain", "30s", "--serve-arg=--lease=6s"]

    p = flow(*scale)
    assert p.returncode == 0, p.stderr
    report = orjson.loads(p.stdout)
    assert report["unfit"] == 0, report
    assert sorted(report["submitted_shapes"]) == ["1×1 CPU, 100M", "1×2 CPUs, 300M"]
    ws = Workspace.open(root)
    try:
        recs = AllocationStore(ws).load_all()
    finally:
        ws.close()
    granted = {}
    for rec in recs:
        assert rec.handle is not None, recs
        row = cluster.job(rec.handle)
        granted[rec.shape] = (
            row["NumNodes"].split("-")[-1],  # pending: `1-1`, at least and at most
            row["NumCPUs"],
            row["CPUs/Task"],
            row["MinMemoryNode"],
            row["TRES"],
        )
    assert granted == {
        "1×1 CPU, 100M": ("1", "1", "1", "100M", "cpu=1,mem=100M,node=1,billing=1"),
        "1×2 CPUs, 300M": ("1", "2", "2", "300M", "cpu=2,mem=300M,node=1,billing=2"),
    }

    # the passes that follow, as from cron: the campaign finishes, the allocations end
    reports, peak = [report], 0
    deadline = time.monotonic() + 100
    while True:
        live = [j for j in cluster.since(first) if j.live]
        peak = max(peak, len(live))
        ws = Workspace.open(root)
        try:
            recs = AllocationStore(ws).load_all()
        finally:
            ws.close()
        if counts(root).get("succeeded") == 3 and not live and all(r.phase.ended for r in recs):
            break
        assert time.monotonic() < deadline, (reports[-3:], recs, dump(root), live)
        time.sleep(1)
        p = flow(*scale)
        assert p.returncode == 0, p.stderr
        reports.append(orjson.loads(p.stdout))
    assert peak <= 2
    assert sum(len(r["submitted"]) for r in reports) == 2  # one per shape, no more
    assert len(cluster.since(first)) == 2
    assert {r.phase for r in recs} == {AllocPhase.CANCELLED}, recs


def test_managers_of_a_several_node_allocation_run_as_one_step_the_drain_reaches(
    root: str, scripts: Path, cluster: Cluster
) -> None:
    """A profile of two nodes gets the srun script; `--nodes=1` of the user's own (which
    wins) lets it run on this one-node cluster, so the step and the passing on of the
    drain signal are Slurm's own, not a model of them."""
    [jid] = submit(root, write_script(scripts, "long.sh", LONG))
    token = "a" + secrets.token_hex(8)
    request = AllocationRequest(
        workspace=root,
        token=token,
        serve_args=("--lease", "10s", "--kill-grace", "2s"),
        time=600.0,
        drain=30.0,
        extra_args=("--nodes=1",),
        log_dir=layout.allocation_logs(root),
        profile=AllocationProfile(nodes=2, cpus=1),
    )
    res = BACKEND.submit(request)
    assert res.outcome is Outcome.CREATED and res.handle, res
    job_id = res.handle
    workdir = job(root, jid).job_dir(root) / "run"
    wait_for(lambda: (workdir / "started").exists(), 60, 0.2)
    # the manager runs in step 0 of the job, not as the batch shell
    steps = run("squeue", "-h", "-s", "-j", job_id, "-o", "%i").stdout.split()
    assert f"{job_id}.0" in steps, steps

    BACKEND.cancel(job_id)  # `scancel -b -s TERM`: only the batch shell hears it
    assert cluster.wait_ended(job_id, 60) == "COMPLETED", log_text(root, token, job_id)
    assert cluster.job(job_id)["ExitCode"] == "0:0"
    log = log_text(root, token, job_id)
    assert f"*** STEP {job_id}.0 ON" in log, log  # the TERM the batch shell passed on
    assert log.count("draining (signal SIGTERM)") == 1, log
    info = job(root, jid)
    assert info.state is State.READY, dump(root)
    assert info.last["why"] == "interrupted"
    assert info.last["try"] == 0  # not charged a failure
