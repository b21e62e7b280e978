"""The allocation reconciler with the local backend (managers as local processes, no batch
system): `flow scale` keeps at most --max managers and ends them when the queue is empty,
a submission with an unknown result is adopted by its token rather than repeated, and
repeated failures pause the queue until `flow scale --unpause`."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from helpers import wait_for
from manager.support import (
    OrphanReaper,
    all_jobs,
    flow,
    make_workspace,
    processes_of,
    submit,
    write_script,
)

from httk_flow.protocol.procs import process_alive
from httk_flow.protocol.workspace import Workspace
from httk_flow.scale.allocations import (
    AllocationRecord,
    AllocationStore,
    AllocPhase,
    Reconciler,
    ScaleSettings,
)
from httk_flow.scale.backends.local import BACKEND as LOCAL


@pytest.fixture
def root(tmp_path: Path) -> Iterator[str]:
    """A workspace whose local managers are all stopped (and reaped) after the test."""
    with OrphanReaper():
        path = make_workspace(tmp_path / "ws")
        try:
            yield path
        finally:
            stop_managers(path)


@pytest.fixture
def program(tmp_path: Path) -> str:
    return write_script(tmp_path / "scripts", "ok.sh", "exit 0\n")


def stop_managers(root: str) -> None:
    """Drain what is left (TERM), then kill managers and attempts that remain."""
    for pid in live_managers(root):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while live_managers(root) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in [*live_managers(root), *processes_of(root)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def records(root: str) -> list[AllocationRecord]:
    ws = Workspace.open(root)
    try:
        return AllocationStore(ws).load_all()
    finally:
        ws.close()


def manager_pid(rec: AllocationRecord) -> int | None:
    if not rec.handle:
        return None
    pid, _, start = rec.handle.partition(":")
    return int(pid) if process_alive(int(pid), int(start or 0)) else None


def live_managers(root: str) -> list[int]:
    return [pid for r in records(root) if (pid := manager_pid(r)) is not None]


def states(root: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for info in all_jobs(root):
        out[info.state.value] = out.get(info.state.value, 0) + 1
    return out


def test_flow_scale_keeps_at_most_max_managers_and_ends_them_when_the_queue_is_empty(
    root: str, program: str
) -> None:
    submit(root, program, 200)
    scale = ["scale", "-w", root, "--backend", "local", "--max", "2"]
    scale += ["--jobs-per-manager", "100", "--once", "--json", "--serve-arg=--lease=6s"]
    peak, reports = 0, []
    deadline = time.monotonic() + 120
    while True:
        p = flow(*scale)
        assert p.returncode == 0, p.stderr
        reports.append(orjson.loads(p.stdout))
        alive = live_managers(root)
        peak = max(peak, len(alive))
        recs = records(root)
        if states(root).get("succeeded") == 200 and not alive and all(r.phase.ended for r in recs):
            break
        assert time.monotonic() < deadline, (reports[-5:], recs, states(root))
        time.sleep(0.3)  # the reconciler's cadence (the scene: `flow scale --once` from cron)
    assert peak <= 2
    assert sum(len(r["submitted"]) for r in reports) == 2
    assert {r.phase for r in recs} == {AllocPhase.CANCELLED}, recs
    assert all(r.ran for r in recs)


def test_a_submission_with_an_unknown_result_is_adopted_by_token_not_repeated(
    root: str, program: str
) -> None:
    submit(root, write_script(Path(program).parent, "slow.sh", "sleep 60\n"))
    settings = ScaleSettings(max=1, jobs_per_manager=100)

    def crash(point: str) -> None:
        raise RuntimeError(f"crashed at {point}")

    ws = Workspace.open(root)
    try:
        with pytest.raises(RuntimeError, match="after_submit"):
            Reconciler(ws, LOCAL, settings, fault=crash).tick()
        [rec] = AllocationStore(ws).load_all()
        assert rec.phase is AllocPhase.REQUESTED and rec.handle is None
        local = Path(ws.flow) / "allocations" / "local"
        assert (local / f"{rec.token}.json").exists()  # the manager was started
        report = Reconciler(ws, LOCAL, settings).tick()
        assert report.adopted == [rec.token]
        assert report.submitted == []
        [rec] = AllocationStore(ws).load_all()
        assert rec.phase in (AllocPhase.PENDING, AllocPhase.RUNNING) and rec.handle
        assert len(live_managers(root)) == 1
        assert [p.name for p in local.glob("*.json")] == [f"{rec.token}.json"]
        # one more pass changes nothing: still exactly one manager
        report = Reconciler(ws, LOCAL, settings).tick()
        assert report.submitted == [] and report.adopted == []
        assert len(live_managers(root)) == 1
    finally:
        ws.close()


def test_managers_that_exit_at_once_pause_the_queue_until_unpaused(root: str, program: str) -> None:
    submit(root, program)
    # `--workers 0` is refused by `flow serve`: every manager exits at once, never ran
    bad = ScaleSettings(max=1, serve_args=("--workers", "0"), backoff_base=0)
    ws = Workspace.open(root)
    try:
        store = AllocationStore(ws)
        reports = []
        for _ in range(5):
            reports.append(Reconciler(ws, LOCAL, bad).tick())
            wait_for(lambda: not live_managers(root), 20, 0.05)
        recs = store.load_all()
        assert [r.phase for r in recs] == [AllocPhase.FAILED] * 3, recs
        assert not any(r.ran for r in recs)
        assert [len(r.submitted) for r in reports] == [1, 1, 1, 0, 0]
        assert "flow scale --unpause" in reports[-1].paused
        assert store.paused() is not None
        p = flow("allocations", "-w", root, "--all", "--json")
        assert "flow scale --unpause" in orjson.loads(p.stdout)["paused"]

        # fixed: `flow scale --unpause` lifts the pause and the next pass submits again
        p = flow("scale", "-w", root, "--backend", "local", "--unpause", "--once", "--max", "1")
        assert p.returncode == 0, p.stderr
        assert "unpaused" in p.stdout
        assert store.paused() is None
        wait_for(lambda: states(root).get("succeeded") == 1, 30, 0.1)
        good = [r for r in store.load_all() if r.phase is not AllocPhase.FAILED]
        assert len(good) == 1
    finally:
        ws.close()
