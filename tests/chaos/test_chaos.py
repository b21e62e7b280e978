"""The chaos harness in CI: bounded runs (120 jobs, 15 kills, 3 managers on one host; 80
jobs, 10 kills with node deaths; 100 jobs, 12 kills and 5 freezes with one 1,000-child
fan-out) must end with every invariant intact; the audit itself must catch what it claims
to catch; and a `flow cancel` killed right after its fence (the one crash point
tests/manager leaves to others) leaves a cancellation the manager ends."""

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

from httk_flow.ops import lookup
from httk_flow.protocol import jobs
from httk_flow.protocol.journal import RawFrame as Frame
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

from .chaos import (
    AuditLine,
    ChaosConfig,
    Expected,
    Freeze,
    FreezeWindows,
    Report,
    audit,
    check_job,
    confirmed_duplicates,
    read_audit,
    run_chaos,
    scan_markers,
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
#: the CI run with freezes and one 1,000-child fan-out whose registration is aimed at (a
#: freeze, then a kill, of the manager that registers the children): under 3 minutes on a
#: loaded 2-core machine
BIG = replace(
    CI,
    jobs=100,
    kills=12,
    freezes=5,
    bigfan_share=0.01,
    bigfan_children=1000,
    seed=CI.seed + 2,
    timeout=170.0,
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
    want = sum(len(e.commits) for e in r.expected)
    if r.tally["manager_deaths"]:
        # a job failed (with the proof) because its managers died: fewer activations ended
        assert r.tally["ending_commits"] <= want
    else:
        assert r.tally["ending_commits"] == want
    assert not r.run_duplicates, r.run_duplicates


@pytest.mark.slow
def test_a_bounded_chaos_run_violates_no_invariant(chaos_run: Report) -> None:
    _assert_clean(chaos_run)


@pytest.mark.slow
def test_a_bounded_chaos_run_with_node_deaths_violates_no_invariant(tmp_path: Path) -> None:
    """Each manager on a host of its own; a manager kill takes its attempts with it, so
    its work can only be taken over on lease evidence (2 x the 2 s lease). The workspace
    streams output (`--logs stream`), and half the jobs are of a second pool, whose ready
    markers lie in class directories (protocol.md §1)."""
    # output streamed into log segments: a kill mid-commit must lose none of it either
    cfg = replace(
        CI,
        jobs=80,
        kills=10,
        nodes=True,
        logs="stream",
        pools=2,
        seed=CI.seed + 1,
        workdir=str(tmp_path),
    )
    r = run_chaos(cfg, say=lambda _: None)
    _assert_clean(r)
    if r.tally["node_death_attempts"]:
        assert any("lease_expired" in k for k in r.recoveries), r.render()


@pytest.mark.slow
def test_a_bounded_chaos_run_with_freezes_and_a_big_fanout_violates_no_invariant(
    tmp_path: Path,
) -> None:
    """Managers are also SIGSTOPped for 1-5 x the lease, and one job spawns 1,000 children
    that the driver's aimed freeze and kill hit while they are registered: every thawed
    manager is fenced, no job ever has two markers (the state tree is read every 0.5 s),
    each child runs once per activation and re-run, none fails with `File exists`."""
    r = run_chaos(replace(BIG, workdir=str(tmp_path)), say=lambda _: None)
    _assert_clean(r)
    assert len(r.freezes) == r.freezes_planned == BIG.freezes, r.render()
    assert r.kinds.get("bigfan") == 1 and r.jobs_total >= BIG.jobs + 1000, r.render()
    assert r.freezes_aimed + r.kills_aimed >= 1, "nothing hit the registration\n" + r.render()
    assert r.scans >= 10, r.render()


# -- the audit is not vacuous --------------------------------------------------------------


def _history(r: Report, kind: str) -> tuple[Expected, State, list[Frame]]:
    """The first job of `kind` of the run, with its final state and history."""
    ws = Workspace.open(r.root)
    try:
        exp = next(e for e in r.expected if e.kind == kind)
        h = lookup.find(ws, exp.key)
        return exp, h.state, jobs.history_json(ws, h)
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
        h = lookup.find(ws, parent.key)
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


def test_the_run_scan_confirms_a_duplicate_marker_and_not_a_move(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    key, moved = "a" * 32, "b" * 32
    for st, name in [
        ("ready", f"{key}.p500.g1.w1-0-1"),
        ("succeeded", f"{key}.p500.g5.w2-0-2"),
        ("waiting", f"{moved}.p500.g3.w2-0-3"),
    ]:
        d = root / ".flow" / "state" / st / "jobs" / "aa"
        d.mkdir(parents=True, exist_ok=True)
        (d / name).touch()
    found = scan_markers(str(root))
    assert len(found[key]) == 2 and len(found[moved]) == 1
    # a scan that saw `moved` twice (it moved from committing to waiting meanwhile)
    suspects = {**found, moved: [(State.COMMITTING, "jobs/aa", f"{moved}.p500.g2.w2-0-2")]}
    suspects[moved] += found[moved]
    dups = confirmed_duplicates(str(root), suspects)
    assert list(dups) == [key]
    assert sorted(st.value for st, _ in dups[key]) == ["ready", "succeeded"]


# -- synthetic histories: the checks of freezes, fan-outs and manager deaths ---------------

JID = "c" * 32
PLACEMENT = "jobs/cc"


def _frame(gen: int, src: str | None, dst: str, by: str, t: float, **more: object) -> Frame:
    f: Frame = {"job": JID, "key": JID, "placement": PLACEMENT, "to": dst, "gen": gen}
    f.update(prev=None if gen == 0 else f"w-0-{gen}", t=t, by=by, step="main", act=1)
    if src is not None:
        f["from"] = src
    f.update(more)
    return f


def _deaths_history(
    owners: list[str], takers: list[str], *, t0: float = 1000.0, evidence: str = "process_gone"
) -> list[Frame]:
    """A one-step job each of whose attempts was taken over, its running attempt committed
    by another manager (takers[n]) on evidence that its owner (owners[n]) died; the last
    takeover fails the job with manager_deaths."""
    frames = [_frame(0, None, "submitted", "chaos", t0), _frame(1, "submitted", "ready", "m0", t0)]
    t = t0
    for n, (owner, taker) in enumerate(zip(owners, takers, strict=True), 1):
        att = {"id": f"a{n:04d}", "n": n, "manager": owner, "host": "h", "step": "main"}
        last = n == len(owners)
        why = "manager_deaths" if last else "interrupted"
        proof = {"owner": owner, "evidence": evidence, "host": "h"}
        g = len(frames)
        t += 10
        frames += [
            _frame(g, "ready", "claimed", owner, t, attempt=att),
            _frame(g + 1, "claimed", "running", owner, t + 0.1, attempt={**att, "pid": 1}),
            _frame(g + 2, "running", "committing", taker, t + 6, attempt=att, evidence=proof),
        ]
        if last:
            failure = {"code": "manager_deaths", "message": "died 3 times", "retryable": False}
            frames.append(_frame(g + 3, "committing", "failed", taker, t + 6, failure=failure))
        else:
            frames.append(_frame(g + 3, "committing", "ready", taker, t + 6))
        frames[-1].update(why=why, attempt=att)
    return frames


def _check(
    frames: list[Frame],
    *,
    kind: str = "normal",
    parent: str | None = None,
    state: State = State.FAILED,
    dead: set[str] | None = None,
    frozen: FreezeWindows | None = None,
    lines: list[AuditLine] | None = None,
) -> tuple[list[str], Counter[str]]:
    exp = Expected(JID, JID, PLACEMENT, kind, parent=parent)
    if lines is None:
        lines = [
            (JID, "main", "1", str(f["attempt"]["id"])) for f in frames if f.get("to") == "running"
        ]
    tally: Counter[str] = Counter()
    found = check_job(
        exp,
        state,
        frames,
        lines,
        kills=0,
        tally=tally,
        recoveries=Counter(),
        dead=dead,
        frozen=frozen,
        lease=2.0,
        factor=2.0,
    )
    return found, tally


OWNERS, TAKERS = ["m1", "m2", "m3"], ["m2", "m3", "m4"]


def test_a_manager_deaths_failure_is_accepted_only_with_its_proof() -> None:
    frames = _deaths_history(OWNERS, TAKERS)
    found, tally = _check(frames, dead={"m1", "m2", "m3"})
    assert found == [] and tally["manager_deaths"] == 1 == tally["manager_deaths_killed"]
    # the owner of the last attempt was alive (not killed, not frozen)
    found, tally = _check(frames, dead={"m1", "m2"})
    assert any("manager_deaths without the proof" in v and "m3" in v for v in found), found
    assert any("expected succeeded" in v for v in found), found
    assert tally["manager_deaths"] == 0
    # a frozen owner (silent past lease x takeover_factor) counts as a death
    t = float(frames[-2]["t"])
    frozen = {"m3": [Freeze("m3", t - 5, t - 5.2, t + 1)]}
    found, tally = _check(frames, dead={"m1", "m2"}, frozen=frozen)
    assert found == [] and tally["manager_deaths_frozen"] == 1, found
    # the first attempt was committed by its own manager: only two deaths in a row
    mine = _deaths_history(OWNERS, ["m1", "m3", "m4"])
    found, _ = _check(mine, dead={"m1", "m2", "m3"})
    assert any("by the manager that ran it" in v for v in found), found
    # an owner that said goodbye did not die
    bye = _deaths_history(OWNERS, TAKERS, evidence="stopped")
    found, _ = _check(bye, dead={"m1", "m2", "m3"})
    assert any("stopped cleanly" in v for v in found), found


def test_the_audit_catches_an_early_takeover_of_a_frozen_manager_and_a_misjudged_holder() -> None:
    frames = _deaths_history(OWNERS, TAKERS)
    t = float(frames[-2]["t"])
    # m3 froze 1 s after its last heartbeat and was taken over 2 s later: too early
    frozen = {"m3": [Freeze("m3", t - 2, t - 3, t + 5)]}
    found, tally = _check(frames, dead={"m1", "m2"}, frozen=frozen)
    assert any("before lease x takeover_factor" in v for v in found), found
    assert tally["takeovers_of_frozen"] == 1
    # the takeover's evidence is about another manager than the one that held the work
    wrong = [dict(f) for f in frames]
    wrong[-2]["evidence"] = {"owner": "m1", "evidence": "process_gone", "host": "h"}
    found, _ = _check(wrong, dead={"m1", "m2", "m3"})
    assert any("held by m3 on evidence about another manager, m1" in v for v in found), found
    # a thawed manager whose rename went through: m1 finishing the commit taken from it
    unfenced = [dict(f) for f in frames]
    i = next(i for i, f in enumerate(unfenced) if f.get("to") == "committing")
    unfenced[i + 1]["by"] = "m1"
    found, _ = _check(unfenced, dead={"m1", "m2", "m3"})
    assert any("m1 moved it committing->ready" in v and "not fenced" in v for v in found), found
    # but m1 may take the commit back from m2 on evidence about m2 (thawed, m2 died since)
    back = [dict(f) for f in frames[: i + 1]]
    proof = {"owner": "m2", "evidence": "process_gone", "host": "h"}
    back.append({**frames[i], "gen": i + 1, "from": "committing", "by": "m1", "evidence": proof})
    back.append({**frames[i + 1], "gen": i + 2, "by": "m1"})
    found, _ = _check(back, state=State.READY, dead={"m1", "m2", "m3"})
    assert not any("not fenced" in v or "another manager" in v for v in found), found


def test_the_audit_catches_a_child_run_twice_and_a_file_exists_failure() -> None:
    att = {"id": "a0001", "n": 1, "manager": "m1", "host": "h", "step": "bigkid"}
    frames = [
        _frame(0, None, "submitted", "m1", 1000.0),
        _frame(1, "submitted", "ready", "m1", 1000.1),
        _frame(2, "ready", "claimed", "m1", 1000.2, attempt=att),
        _frame(3, "claimed", "running", "m1", 1000.3, attempt=att),
        _frame(4, "running", "committing", "m1", 1000.4, attempt=att, why="succeed"),
        _frame(5, "committing", "succeeded", "m1", 1000.5, attempt=att, why="succeed"),
    ]
    for f in frames:
        f["step"] = "bigkid"
    once = [(JID, "bigkid", "1", "a0001")]
    found, _ = _check(frames, kind="bigkid", parent="p" * 32, state=State.SUCCEEDED, lines=once)
    assert found == [], found
    # a second marker of the child ran it again (its attempt a0001 too, in its own chain)
    twice = [*once, (JID, "bigkid", "1", "a0001")]
    found, _ = _check(frames, kind="bigkid", parent="p" * 32, state=State.SUCCEEDED, lines=twice)
    assert any("ran 2 times in activation 1, but the journal re-ran" in v for v in found), found
    # the second marker's claim met the first's attempt directory
    eexist = [*frames[:3]]
    msg = "cannot start the attempt (File exists: .../a0001)"
    failure = {"code": "launch_error", "message": msg, "retryable": False}
    eexist.append(_frame(3, "claimed", "failed", "m2", 1000.3, failure=failure))
    found, _ = _check(eexist, kind="bigkid", parent="p" * 32, state=State.FAILED, lines=[])
    assert any("records `File exists`" in v for v in found), found


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
