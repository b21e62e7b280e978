"""Each NFS hazard, modelled in this process: threads racing on markers through the faulty
filesystem claim every job exactly once, and a manager serving through it converges."""

from __future__ import annotations

import errno
import io
import os
import random
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import serve_in_process

from httk_flow.errors import FlowError, TransitionConflict
from httk_flow.manager.claim import ClaimPass
from httk_flow.manager.log import ManagerLog
from httk_flow.manager.loop import Manager
from httk_flow.manager.passes import PassContext
from httk_flow.protocol import jobs
from httk_flow.protocol.discovery import walk_all
from httk_flow.protocol.frames import Body
from httk_flow.protocol.fsio import FileSystem, fs, set_filesystem
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.transition import transition
from httk_flow.protocol.workspace import Workspace

from .faultfs import LateNames, LingeringNames, LyingRenames, StaleHandles, markers_only

JOBS = 40


def _ready_jobs(root: str, program: str, n: int = JOBS) -> list[str]:
    """n jobs moved to ready by hand (through the plain filesystem)."""
    ws = Workspace.open(root)
    try:
        ids = [s.id for s in Submitter(ws).submit([SubmitRequest(program=program)] * n)]
        for h in list(jobs.all_jobs(ws, (State.SUBMITTED,))):
            transition(ws, h, State.READY, Body(), actor="setup")
        return ids
    finally:
        ws.close()


@pytest.fixture
def program(tmp_path: Path) -> str:
    p = tmp_path / "ok.sh"
    p.write_text('#!/bin/sh\necho ran >> "$FLOW_WORKDIR/runs"\nexit 0\n')
    p.chmod(0o755)
    return str(p)


def _race(root: str, racers: int, rounds: int) -> tuple[dict[str, list[str]], list[str]]:
    """`racers` threads each claim whatever ready marker they find, `rounds` walks each.

    Returns (winner -> job ids it claimed, errors other than losing the race)."""
    wins: dict[str, list[str]] = {f"r{i}": [] for i in range(racers)}
    odd: list[str] = []
    start = threading.Barrier(racers)

    def racer(me: str, seed: int) -> None:
        ws = Workspace.open(root)
        rng = random.Random(seed)
        try:
            start.wait()
            for _ in range(rounds):
                found = list(walk_all(ws, State.READY))
                rng.shuffle(found)
                for h in found:
                    try:
                        transition(ws, h, State.CLAIMED, Body(extra=(("racer", me),)), actor=me)
                    except TransitionConflict:
                        continue
                    except FlowError as e:
                        odd.append(e.render())
                        continue
                    wins[me].append(h.job_id)
        finally:
            ws.close()

    threads = [threading.Thread(target=racer, args=(f"r{i}", i)) for i in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return wins, odd


def _claimed_once(root: str, ids: list[str], wins: dict[str, list[str]]) -> None:
    set_filesystem(FileSystem())  # the truth, not the model's view
    claims = Counter(j for won in wins.values() for j in won)
    assert sorted(claims) == sorted(ids), "some job was never claimed"
    assert max(claims.values()) == 1, [j for j, n in claims.items() if n > 1]
    ws = Workspace.open(root)
    try:
        found = list(jobs.all_jobs(ws))
        assert Counter(h.key for h in found).most_common(1)[0][1] == 1
        assert {h.state for h in found} == {State.CLAIMED}
        by_job = {j: who for who, won in wins.items() for j in won}
        for h in found:
            assert ws.reader.read(h.marker.ref)["racer"] == by_job[h.job_id]
    finally:
        ws.close()


def test_renames_that_report_an_error_after_happening_are_won_once(root: str, program: str) -> None:
    ids = _ready_jobs(root, program)
    model = LyingRenames(applies=markers_only)
    set_filesystem(model)
    wins, odd = _race(root, racers=3, rounds=2)
    assert model.lies >= JOBS
    assert not odd, odd
    _claimed_once(root, ids, wins)


def test_lingering_names_never_let_a_job_be_claimed_twice(root: str, program: str) -> None:
    ids = _ready_jobs(root, program)
    model = LingeringNames(linger=5.0)
    set_filesystem(model)
    wins, odd = _race(root, racers=3, rounds=3)
    assert model.ghosts > 0
    # a ghost cannot be moved: the racer is told so, and nobody claims twice
    assert all("cannot move marker" in e for e in odd), odd
    _claimed_once(root, ids, wins)


def test_late_names_are_claimed_once_they_appear(root: str, program: str) -> None:
    # the model's clock is the test's: names are "young" until the test moves it on, however
    # long the submission and the first race take on a busy machine
    now = [0.0]
    model = LateNames(late=0.3, clock=lambda: now[0])
    set_filesystem(model)
    ws = Workspace.open(root)
    list(walk_all(ws, State.READY))  # the first listing: the state dir is still empty
    ws.close()
    ids = _ready_jobs(root, program, 10)
    wins, odd = _race(root, racers=2, rounds=1)
    assert not any(wins.values()), "names younger than the delay are hidden"
    now[0] += 0.4
    wins, odd = _race(root, racers=2, rounds=1)
    # the model's clock stands still: a racer that loses a job to the other cannot list the
    # winner's new (young) marker; on a filesystem that lists late that is a lost race, not
    # a vanished marker to report (and `flow fsck` to run)
    assert model.hidden > 0 and odd == [], odd
    _claimed_once(root, ids, wins)


def _serve(root: str, model: FileSystem, *, idle: float = 0.0) -> tuple[Manager, int]:
    """Run a manager in this process through `model` until it idles (at most a minute)."""
    ws = Workspace.open(root)
    set_filesystem(model)
    try:
        return serve_in_process(ws, idle=idle)
    finally:
        set_filesystem(FileSystem())
        ws.close()


def _all_succeeded_once(root: str, ids: list[str]) -> None:
    ws = Workspace.open(root)
    try:
        found = {h.job_id: h for h in jobs.all_jobs(ws)}
        assert sorted(found) == sorted(ids), "a job was lost"
        states = Counter(h.state for h in found.values())
        assert states == Counter({State.SUCCEEDED: len(ids)}), states
        for h in found.values():
            runs = Path(ws.job_dir(h.placement, h.key)) / "run" / "runs"
            assert runs.read_text() == "ran\n", f"{h.key} ran {runs.read_text()!r}"
    finally:
        ws.close()


def _submitted(root: str, program: str, n: int) -> list[str]:
    ws = Workspace.open(root)
    try:
        return [s.id for s in Submitter(ws).submit([SubmitRequest(program=program)] * n)]
    finally:
        ws.close()


def test_a_manager_converges_through_lying_marker_renames(root: str, program: str) -> None:
    ids = _submitted(root, program, 12)
    model = LyingRenames(applies=markers_only)
    _serve(root, model)
    # four marker renames a job: registered, claimed, running, committed directly
    assert model.lies >= 12 * 4
    _all_succeeded_once(root, ids)


def test_a_manager_converges_through_late_names(root: str, program: str) -> None:
    ids = _submitted(root, program, 12)
    model = LateNames(late=0.5)
    _serve(root, model, idle=1.5)
    assert model.hidden > 0
    _all_succeeded_once(root, ids)


def test_a_claim_pass_meeting_ghosts_of_its_own_claims_claims_nothing_more(
    root: str, program: str
) -> None:
    """A ghost cannot be moved (its source seems to exist): the pass reports it once and
    claims nothing, rather than letting the FlowError stop the manager."""
    _ready_jobs(root, program, 3)
    set_filesystem(LingeringNames(linger=30.0))
    ws = Workspace.open(root)
    try:
        log = io.StringIO()
        ctx = PassContext(ws, "mtest", ManagerLog("mtest", stream=log), (), lambda: None)
        claim = ClaimPass(ctx, (), (), None)
        got = [c for _ in range(3) for c in claim.take(1, 100)]
        assert len(got) == 3
        # the next scans list the three claimed markers again, as ghosts
        assert claim.take(1, 100) == []
        assert claim.take(1, 100) == []
        problems = [line for line in log.getvalue().splitlines() if "problem:" in line]
        assert len(problems) == 3 and all("cannot move marker" in p for p in problems), problems
    finally:
        ws.close()


def test_a_manager_converges_through_lingering_names(root: str, program: str) -> None:
    ids = _submitted(root, program, 12)
    model = LingeringNames(linger=1.0)
    _serve(root, model)
    assert model.ghosts > 0
    _all_succeeded_once(root, ids)


def test_a_manager_retries_reads_that_meet_a_stale_handle(root: str, program: str) -> None:
    ids = _submitted(root, program, 6)
    model = StaleHandles()
    _serve(root, model)
    assert model.stale > 0
    _all_succeeded_once(root, ids)


def _estale_once(real: Callable[..., object], calls: list[int]) -> Callable[..., object]:
    def flaky(*args: object) -> object:
        calls.append(1)
        if len(calls) == 1:
            raise OSError(errno.ESTALE, os.strerror(errno.ESTALE))
        return real(*args)

    return flaky


def test_an_estale_read_of_an_open_file_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "job.json"
    path.write_bytes(b'{"a": 1}')
    calls: list[int] = []
    monkeypatch.setattr(os, "read", _estale_once(os.read, calls))
    assert fs.read_bytes(str(path), 1024) == b'{"a": 1}'
    assert len(calls) == 2


def test_an_estale_open_is_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "job.json"
    path.write_bytes(b'{"a": 1}')
    calls: list[int] = []
    monkeypatch.setattr(os, "open", _estale_once(os.open, calls))
    assert fs.read_bytes(str(path), 1024) == b'{"a": 1}'


def test_a_manager_converges_through_renames_that_all_lie(root: str, program: str) -> None:
    ids = _submitted(root, program, 6)
    _serve(root, LyingRenames())
    _all_succeeded_once(root, ids)
