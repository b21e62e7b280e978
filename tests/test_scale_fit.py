"""The reconciler sizes allocations to the work: it asks for a walltime that fits the
longest queued request before the drain and the signal margin (up to --max-time), counts
no work that no allocation it would submit can fit, replaces allocations that cannot serve
what is queued, and says why an allocation that ran started no attempt. A fake backend
stands for the batch system; the workspace and the heartbeats are real."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from manager.support import make_workspace, submit, write_script

from httk_flow.cli.main import cli
from httk_flow.protocol.leases import ManagerInfo, write_heartbeat
from httk_flow.protocol.procs import proc_start_time
from httk_flow.protocol.workspace import Workspace
from httk_flow.scale.allocations import AllocationStore, AllocPhase, Reconciler, ScaleSettings
from httk_flow.scale.backends.base import (
    AllocationRequest,
    Observation,
    Outcome,
    Phase,
    SubmitResult,
)


class FakeBatch:
    """Accepts every submission (handles j1, j2, ...); phases as the test sets them."""

    name = "fake"
    signal_margin = 60.0

    def __init__(self) -> None:
        self.requests: list[AllocationRequest] = []
        self.phases: dict[str, Phase] = {}
        self.cancelled: list[str] = []

    def submit(self, request: AllocationRequest) -> SubmitResult:
        self.requests.append(request)
        handle = f"j{len(self.requests)}"
        self.phases[handle] = Phase.PENDING
        return SubmitResult(Outcome.CREATED, handle)

    def observe(self, handles: list[str]) -> dict[str, Observation]:
        return {h: Observation(self.phases.get(h, Phase.UNKNOWN)) for h in handles}

    def find_by_token(self, workspace: str, token: str) -> str | None:
        return None

    def cancel(self, handle: str) -> None:
        self.cancelled.append(handle)
        self.phases[handle] = Phase.DONE

    def diagnostics(self) -> dict[str, str]:
        return {}

    def allocation_end(self) -> float | None:
        return None


@pytest.fixture
def root(tmp_path: Path) -> str:
    return make_workspace(tmp_path / "ws")


@pytest.fixture
def program(tmp_path: Path) -> str:
    return write_script(tmp_path / "scripts", "ok.sh", "exit 0\n")


def tick(root: str, batch: FakeBatch, **settings: object) -> Reconciler:
    ws = Workspace.open(root)
    rec = Reconciler(ws, batch, ScaleSettings(**settings))  # type: ignore[arg-type]
    rec.report = rec.tick()  # type: ignore[attr-defined]
    ws.close()
    return rec


def records(root: str) -> list[object]:
    ws = Workspace.open(root)
    try:
        return list(AllocationStore(ws).load_all())
    finally:
        ws.close()


def test_work_no_allocation_would_fit_is_not_demand_and_is_said(root: str, program: str) -> None:
    submit(root, program, count=3, time=120.0)
    batch = FakeBatch()
    # 2m allocations, 30 s drain, 60 s margin, 30 s to start: nothing of 2m fits
    r = tick(root, batch, time=120.0, drain=30.0).report  # type: ignore[attr-defined]
    assert (r.desired, r.submitted, r.unfit) == (0, [], 3)
    assert r.unfit_reason == (
        "need up to 2m, more than an allocation of 2m leaves before its drain; "
        "give --max-time 4m or more"
    )
    assert batch.requests == []


def test_max_time_sizes_the_walltime_to_the_longest_request(root: str, program: str) -> None:
    submit(root, program, count=2, time=120.0)
    submit(root, program, count=2, time=30.0)
    submit(root, program, count=2)  # no declared time: fits anything
    batch = FakeBatch()
    r = tick(root, batch, time=60.0, drain=30.0, max_time=600.0).report  # type: ignore[attr-defined]
    assert (r.desired, len(r.submitted), r.unfit) == (1, 1, 0)
    # 2m of work + 30 s drain + 60 s margin + 30 s to start, in whole minutes
    assert r.walltime == 240.0
    [req] = batch.requests
    assert (req.time, req.drain, req.margin) == (240.0, 30.0, None)
    [rec] = records(root)
    assert rec.time == 240.0  # type: ignore[attr-defined]
    # a cap below what the work needs: that work is not demand, the rest is
    batch = FakeBatch()
    r = tick(root, batch, time=60.0, drain=30.0, max_time=180.0, max=0).report  # type: ignore[attr-defined]
    assert r.unfit == 2


def test_an_allocation_too_short_for_everything_queued_is_replaced(root: str, program: str) -> None:
    submit(root, program, count=2, time=120.0)
    batch = FakeBatch()
    tick(root, batch, time=120.0, drain=30.0, max_time=600.0, max=1)  # sized: 4m
    assert [r.time for r in batch.requests] == [240.0]
    # the same reconciler state submitted under a shorter, fixed walltime before
    ws = Workspace.open(root)
    store = AllocationStore(ws)
    [old] = store.load_all()
    from dataclasses import replace

    store.save(replace(old, time=120.0))
    ws.close()
    r = tick(root, batch, time=120.0, drain=30.0, max_time=600.0, max=2).report  # type: ignore[attr-defined]
    assert r.replaced == [old.token]
    assert batch.cancelled == ["j1"]
    assert len(r.submitted) == 1 and batch.requests[-1].time == 240.0
    by_token = {x.token: x for x in records(root)}  # type: ignore[attr-defined]
    assert by_token[old.token].phase is AllocPhase.CANCELLING  # type: ignore[attr-defined]
    assert by_token[old.token].reason == (  # type: ignore[attr-defined]
        "cannot serve what is queued: the shortest request is 2m, it has 0s"
    )


def test_an_allocation_that_ran_no_attempt_says_why(root: str, program: str) -> None:
    submit(root, program, count=2, time=120.0)
    batch = FakeBatch()
    tick(root, batch, time=300.0, drain=30.0)
    [rec] = records(root)
    batch.phases["j1"] = Phase.RUNNING
    # its manager: alive on this host, 40 s of usable time, two jobs found too long
    now = time.time()
    info = ManagerInfo(
        id="mfake",
        host=Workspace.open(root).host,
        pid=os.getpid(),
        started=now,
        ends_at=now + 40,
        start_time=proc_start_time(os.getpid()) or 0,
        allocation=rec.token,  # type: ignore[attr-defined]
        unfit=2,
        unfit_need=120.0,
    )
    ws = Workspace.open(root)
    write_heartbeat(ws, info)
    ws.close()
    # idle with 40 s left, and nothing queued fits in 40 s: replaced by a fitting one
    r = tick(root, batch, time=300.0, drain=30.0).report  # type: ignore[attr-defined]
    assert r.replaced == [rec.token] and len(r.submitted) == 1  # type: ignore[attr-defined]
    tick(root, batch, time=300.0, drain=30.0)  # the cancel has been done: it ended
    done = {x.token: x for x in records(root)}[rec.token]  # type: ignore[attr-defined]
    assert done.phase is AllocPhase.CANCELLED  # type: ignore[attr-defined]
    assert done.ran and done.attempts == 0  # type: ignore[attr-defined]
    assert done.reason == (  # type: ignore[attr-defined]
        "started no attempt: 2 ready jobs needed up to 2m, more than the 40s its manager could use"
    )
    out = CliRunner().invoke(cli, ["-w", root, "allocations", "--all"]).stdout
    assert "started no attempt: 2 ready jobs needed up to 2m" in out


def test_sbatch_and_scale_warn_of_a_walltime_that_leaves_no_time_for_work(root: str) -> None:
    r = CliRunner().invoke(
        cli, ["-w", root, "scale", "--once", "--max", "0", "--time", "3m", "--drain", "2m"]
    )
    assert r.exit_code == 0, r.output
    assert r.stderr == ""  # the local backend signals nothing early: 1m is left
    r = CliRunner().invoke(
        cli,
        [
            *("-w", root, "scale", "--once", "--max", "0", "--time", "3m", "--drain", "2m"),
            *("--signal-margin", "1m"),
        ],
    )
    assert r.stderr == (
        "flow: warning: --time 3m leaves no time for work: managers claim only jobs that "
        "end before the drain, which is signalled 2m before the end, and may come up to 1m "
        "early; ask for at least 4m\n"
    )
