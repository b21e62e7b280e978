"""The chaos harness in CI: bounded runs (120 jobs, 15 kills, 3 managers on one host; 80
jobs, 10 kills with node deaths) must end with every invariant intact; the audit itself
must catch what it claims to catch; and a `flow cancel` killed right after its fence (the
one crash point tests/manager leaves to others) leaves a cancellation the manager ends."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import wait_for
from manager.support import (
    Managers,
    dump,
    job,
    log_of,
    make_workspace,
    processes_of,
    submit,
    write_script,
)

from httk_flow import jobs
from httk_flow.journal import Frame
from httk_flow.states import State
from httk_flow.workspace import Workspace

from .chaos import (
    AuditLine,
    ChaosConfig,
    Expected,
    Report,
    audit,
    check_job,
    read_audit,
    run_chaos,
)

#: the CI run: small enough for well under 2 minutes on a loaded 2-core machine (about
#: 10-20 s), large enough that every kind of job meets kills of both kinds
CI = ChaosConfig(
    jobs=120,
    kills=15,
    managers=3,
    seed=int(os.environ.get("CHAOS_SEED", "20240611")),
    timeout=100.0,
    verbose=False,
)


@pytest.fixture(scope="module")
def chaos_run(tmp_path_factory: pytest.TempPathFactory) -> Report:
    # (the managers get the environment without FLOW_CRASH_AT and FLOW_WORKSPACE)
    work = tmp_path_factory.mktemp("chaos")
    return run_chaos(replace(CI, workdir=str(work)), say=lambda _: None)


def _assert_clean(r: Report) -> None:
    print(r.render())
    c = r.config
    assert r.violations == [], r.render()
    assert r.kills == c.kills, f"only {r.kills} of {c.kills} kills fired\n{r.render()}"
    assert r.kills_manager and r.kills_attempt, r.render()
    assert r.fsck.get("clean") is True and r.fsck.get("exit") == 0, r.fsck
    assert r.jobs_total > c.jobs, "the fan-out jobs spawned no children"
    assert r.tally["ending_commits"] == sum(len(e.commits) for e in r.expected)


@pytest.mark.slow
def test_a_bounded_chaos_run_violates_no_invariant(chaos_run: Report) -> None:
    _assert_clean(chaos_run)


@pytest.mark.slow
def test_a_bounded_chaos_run_with_node_deaths_violates_no_invariant(tmp_path: Path) -> None:
    """Each manager on a host of its own; a manager kill takes its attempts with it, so
    its work can only be taken over on lease evidence (2 x the 2 s lease)."""
    cfg = replace(CI, jobs=80, kills=10, nodes=True, seed=CI.seed + 1, workdir=str(tmp_path))
    r = run_chaos(cfg, say=lambda _: None)
    _assert_clean(r)
    if r.tally["node_death_attempts"]:
        assert any("lease_expired" in k for k in r.recoveries), r.render()


# -- the audit is not vacuous --------------------------------------------------------------


def _history(r: Report, kind: str) -> tuple[Expected, State, list[Frame]]:
    """The first job of `kind` of the run, with its final state and history."""
    ws = Workspace.open(r.root)
    try:
        exp = next(e for e in r.expected if e.kind == kind)
        h = jobs.find(ws, exp.key)
        return exp, h.state, jobs.history(ws, h)
    finally:
        ws.close()


def _violations(
    r: Report, exp: Expected, state: State, frames: list[Frame], lines: list[AuditLine]
) -> list[str]:
    return check_job(
        exp,
        state,
        frames,
        lines,
        kills=r.killed_jobs[exp.id],
        tally=Counter(),
        recoveries=Counter(),
        dead=r.dead_managers,
        known=lambda bug, what: None,
    )


@pytest.mark.slow
def test_the_audit_catches_a_replayed_commit_a_ghost_run_and_a_wrong_ending(
    chaos_run: Report,
) -> None:
    r = chaos_run
    exp, state, frames = _history(r, "steps")
    lines = read_audit(r.audit_dir, exp.id)
    assert _violations(r, exp, state, frames, lines) == []
    # an activation committed a second time: the last commit replayed
    replayed = [*frames, *[dict(f) for f in frames[-2:]]]
    found = _violations(r, exp, state, replayed, lines)
    assert any("committed twice" in v for v in found), found
    assert any("committed again after it ended" in v for v in found), found
    # a step executed by an attempt the journal never launched
    ghost = [*lines, (exp.id, "two", "2", "a0999")]
    found = _violations(r, exp, state, frames, ghost)
    assert any("journal launched it as None" in v for v in found), found
    # committed outcomes whose step never ran
    found = _violations(r, exp, state, frames, [])
    assert any("its step never ran" in v for v in found), found
    # the wrong end state
    found = _violations(r, exp, State.FAILED, frames, lines)
    assert any("expected succeeded" in v for v in found), found
    # a takeover that records no evidence
    stolen = [dict(f) for f in frames]
    i = next(i for i, f in enumerate(stolen) if f.get("to") == "committing")
    stolen[i]["by"] = "mthief"
    stolen[i].pop("evidence", None)
    found = _violations(r, exp, state, stolen, lines)
    assert any("records no evidence" in v for v in found), found


@pytest.mark.slow
def test_the_audit_catches_a_duplicate_marker_and_a_lost_payload(
    chaos_run: Report, tmp_path: Path
) -> None:
    copy = tmp_path / "ws"
    shutil.copytree(chaos_run.root, copy, symlinks=True)
    root = str(copy)
    ws = Workspace.open(root)
    try:
        parent = next(e for e in chaos_run.expected if e.kind == "fanout")
        kid = next(e for e in chaos_run.expected if e.parent == parent.id)
        h = jobs.find(ws, parent.key)
        dup = Path(ws.state_dir(State.FAILED, h.placement))
        dup.mkdir(parents=True, exist_ok=True)
        shutil.copy(h.path(ws), dup / h.marker.name)
        shutil.rmtree(ws.job_dir(kid.placement, kid.key))
    finally:
        ws.close()
    r = Report(chaos_run.config)
    audit(root, chaos_run.audit_dir, chaos_run.expected, chaos_run.killed_jobs, r)
    assert any(f"job {parent.key} has 2 markers" in v for v in r.violations), r.violations
    assert any(f"{kid.key} is missing" in v for v in r.violations), r.violations
    assert any(f"job {kid.key}: marker without a valid payload" in v for v in r.violations)
    assert r.fsck.get("exit") == 1, "fsck reports the duplicate marker"


# -- the one crash point the manager crash tests leave to others: the CLI's fence ------------

SLEEPER = """
touch "$FLOW_WORKDIR/started"
sleep 30
publish '{"action":"succeed"}'
"""


def test_a_cancel_killed_right_after_its_fence_is_finished_by_the_manager(
    tmp_path: Path, managers: Managers
) -> None:
    root = make_workspace(tmp_path / "ws")
    [jid] = submit(root, write_script(tmp_path / "scripts", "sleeper.sh", SLEEPER))
    p = managers.start(root, command="serve")
    ws_dir = tmp_path / "ws"
    wait_for(lambda: any(ws_dir.glob("jobs/*/*/run/started")) or p.poll() is not None, 20)
    assert p.poll() is None, log_of(p)
    env = {k: v for k, v in os.environ.items() if k != "FLOW_WORKSPACE"}
    env["FLOW_CRASH_AT"] = "cancel.after_fence"
    cli = subprocess.run(
        [sys.executable, "-m", "httk_flow", "-w", root, "cancel", jid],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == -signal.SIGKILL, cli.stderr
    wait_for(lambda: job(root, jid).state is State.CANCELLED, 20)
    info = job(root, jid)
    assert [f["to"] for f in info.frames[-2:]] == ["cancelling", "cancelled"], dump(root)
    assert info.last["evidence"]["verified"] == "reaped by its manager"
    assert not processes_of(root), "the attempt's process group was stopped"
    p.terminate()
    assert p.wait(15) == 0, log_of(p)
