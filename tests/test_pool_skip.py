"""Scans pass by other pools' markers by name, emptied directories are retired, and
status counts ready jobs by name: a backlog a manager does not serve costs it little."""

from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path

import pytest
from helpers import manager_in_this_process, plant_marker
from nfs.faultfs import Recorder, StaleDirStats

from httk_flow.manager.config import ManagerConfig
from httk_flow.manager.loop import Manager
from httk_flow.ops import steering
from httk_flow.ops.status import workspace_status
from httk_flow.protocol import discovery, names
from httk_flow.protocol.counting import count_markers, tally_markers
from httk_flow.protocol.discovery import RETIRE_MIN_BYTES, MarkerStream, walk_all
from httk_flow.protocol.frames import Body
from httk_flow.protocol.fsio import set_filesystem
from httk_flow.protocol.names import Marker, RecordRef, marker_service, new_id
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.transition import JobHandle, locate_key, transition
from httk_flow.protocol.workspace import Workspace

KEY = "a" * 32


@pytest.mark.parametrize(
    ("name", "service"),
    [
        (f"{KEY}.p500.g1.w1-0-0", ""),
        (f"{KEY}.p500.g1.c1-0-0", ""),  # a writer id starting with c is the ref, not a class
        (f"{KEY}.p500.g1.cq1.c1-0-0", "q1"),
        (f"tag--{KEY}.p001.gz.t5.cabc.s0000abcd.a.w-0-0", "abc"),
        (f"{KEY}.p500.g1.t5.s0000abcd.cw-1-2", ""),
    ],
)
def test_marker_service_reads_the_class_field_alone(name: str, service: str) -> None:
    assert marker_service(name) == service
    assert Marker.from_name(name).service == service


def _plant(ws: Workspace, placement: str, service: str, n: int) -> None:
    for _ in range(n):
        m = Marker(new_id(), 500, 1, RecordRef("w0", 0, 0), service=service)
        path = JobHandle(State.READY, placement, m).path(ws)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "x").close()


def test_a_names_filter_yields_and_parses_only_the_names_it_accepts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = Workspace.create(str(tmp_path / "ws"))
    _plant(ws, "jobs/aa", "pa", 3)
    _plant(ws, "jobs/aa", "pb", 50)
    parsed = Counter[str]()
    real = Marker.parse_or_none

    def counting(name: str) -> Marker | None:
        parsed[marker_service(name)] += 1
        return real(name)

    monkeypatch.setattr(discovery.Marker, "parse_or_none", staticmethod(counting))
    got = list(walk_all(ws, State.READY, names=lambda n: marker_service(n) == "pa"))
    assert sorted(h.marker.service for h in got) == ["pa"] * 3
    assert parsed == {"pa": 3}  # the other pool's 50 names were never parsed
    ws.close()


def test_a_cycle_of_foreign_markers_only_counts_as_finding_nothing(tmp_path: Path) -> None:
    """So the stream rests between such cycles instead of spinning through them."""
    ws = Workspace.create(str(tmp_path / "ws"))
    _plant(ws, "jobs/aa", "pb", 20)
    now = [100.0]
    stream = MarkerStream(
        ws, State.READY, rest=0.5, clock=lambda: now[0], names=lambda n: marker_service(n) == "pa"
    )
    assert stream.next_batch(1000) == []
    assert stream.cycles == 1
    stream.next_batch(1000)
    assert stream.cycles == 1  # resting: no new cycle began
    now[0] += 0.6
    stream.next_batch(1000)
    assert stream.cycles == 2
    # without the filter every cycle finds the 20 and none rests
    plain = MarkerStream(ws, State.READY, rest=0.5, clock=lambda: now[0])
    assert len(plain.next_batch(1000)) == 20
    assert len(plain.next_batch(1000)) == 20
    stream.close()
    plain.close()
    ws.close()


def _grow_and_empty(d: str) -> None:
    """A directory that held many names and lost them: ext4 keeps its size."""
    os.makedirs(d, exist_ok=True)
    long = "x" * 200
    for i in range(200):
        open(os.path.join(d, f"{long}{i}"), "x").close()
    for i in range(200):
        os.unlink(os.path.join(d, f"{long}{i}"))


def test_a_retiring_stream_removes_large_empty_directories_only(tmp_path: Path) -> None:
    ws = Workspace.create(str(tmp_path / "ws"))
    big, small = ws.state_dir(State.READY, "jobs/aa"), ws.state_dir(State.READY, "jobs/bb")
    _grow_and_empty(big)
    if os.stat(big).st_size < RETIRE_MIN_BYTES:
        pytest.skip("this filesystem shrinks emptied directories")
    os.makedirs(small)
    kept = plant_marker(ws, State.READY, "jobs/cc")
    rec = Recorder()
    set_filesystem(rec)
    stream = MarkerStream(ws, State.READY, retire=True)
    assert [h.key for h in stream.next_batch(1000)] == [kept.key]
    stream.close()
    assert rec.removed == [big]  # through the seam, and only the large empty one
    assert not os.path.exists(big)
    assert os.path.isdir(small) and os.path.isdir(ws.state_dir(State.READY))
    ws.close()


def test_a_transition_into_a_retired_directory_makes_it_again(tmp_path: Path) -> None:
    ws = Workspace.create(str(tmp_path / "ws"))
    (spec,) = Submitter(ws).submit([SubmitRequest(program="true", placement="p")])
    (h,) = walk_all(ws, State.SUBMITTED)
    ready = transition(ws, h, State.READY, Body(), actor="t")
    paused = transition(ws, ready, State.PAUSED, Body(), actor="t")
    os.rmdir(ws.state_dir(State.READY, "p"))  # retired by a manager meanwhile
    again = transition(ws, paused, State.READY, Body(), actor="t")
    assert os.path.exists(again.path(ws))
    assert [x.key for x in walk_all(ws, State.READY)] == [spec.key]
    ws.close()


def test_tally_counts_by_class_and_backoff_through_the_seam(tmp_path: Path) -> None:
    ws = Workspace.create(str(tmp_path / "ws"))
    _plant(ws, "jobs/aa", "", 4)
    _plant(ws, "jobs/aa/sub", "q1", 2)
    m = Marker(new_id(), 500, 1, RecordRef("w0", 0, 0), not_before=36**3)
    path = JobHandle(State.READY, "jobs/ab", m).path(ws)
    os.makedirs(os.path.dirname(path))
    open(path, "x").close()
    open(os.path.join(os.path.dirname(path), "junk.txt"), "x").close()
    os.mkdir(os.path.join(os.path.dirname(path), f"{KEY}.p500.g1.w1-0-0"))  # not a file
    rec = Recorder()
    set_filesystem(rec)
    tally = tally_markers(ws, State.READY)
    assert tally == {(None, None): 4, (None, "q1"): 2, ("1000", None): 1}
    assert count_markers(ws, State.READY) == 7
    assert ws.state_dir(State.READY, "jobs/aa/sub") in rec.listed
    ws.close()


def test_status_by_state_counts_what_a_walk_would(tmp_path: Path) -> None:
    ws = Workspace.create(str(tmp_path / "ws"))
    sub = Submitter(ws)
    list(sub.submit([SubmitRequest(program="true", pool="A") for _ in range(3)]))
    list(sub.submit([SubmitRequest(program="true") for _ in range(2)]))
    for h in list(walk_all(ws, State.SUBMITTED)):
        transition(ws, h, State.READY, Body(), actor="t")
    r = workspace_status(ws)
    assert r.counts[State.READY] == 5
    by_class = {cid: q.n for cid, q in r.ready_times.items()}
    assert sorted(by_class.values()) == [2, 3]
    assert sum(n for _, n in r.blocked) >= 5  # no live manager: every ready job blocked
    ws.close()


def test_a_manager_of_one_pool_runs_its_jobs_beside_another_pools_backlog(
    tmp_path: Path,
) -> None:
    ws = Workspace.create(str(tmp_path / "ws"))
    sub = Submitter(ws)
    mine = {s.key for s in sub.submit(SubmitRequest(program="true", pool="A") for _ in range(3))}
    theirs = {s.key for s in sub.submit(SubmitRequest(program="true", pool="B") for _ in range(40))}
    manager = Manager(
        ws,
        ManagerConfig(
            workers=2, pools=("A",), exit_when_idle=0.0, poll_interval=0.05, verbose=False
        ),
    )
    watchdog = threading.Timer(60, lambda: setattr(manager.drain, "exit_now", True))
    watchdog.start()
    try:
        with manager_in_this_process():
            rc = manager.run(install_signals=False)
    finally:
        watchdog.cancel()
    assert rc == 0 and not manager.drain.exit_now
    assert {h.key for h in walk_all(ws, State.SUCCEEDED)} == mine
    assert {h.key for h in walk_all(ws, State.READY)} == theirs
    assert manager.claim.wants_name(next(walk_all(ws, State.READY)).marker.name) is False
    assert names.marker_service(next(walk_all(ws, State.SUCCEEDED)).marker.name) != ""
    ws.close()


def _resumed_into_a_quiet_shard(
    tmp_path: Path, *, exit_when_idle: float, resume_at: float
) -> dict[str, object]:
    """`flow run --pool A --idle N` beside pool B's ready jobs: its idle check soon stats
    the shards holding only B's markers instead of listing them. A job of pool A that
    `flow resume` renames into one of them at `resume_at` (paused -> ready, by the resume
    itself: no registration to see) must still run, and the run stop idle with nothing
    left. What the run saw and left, for the test to check."""
    ws = Workspace.create(str(tmp_path / "ws"))
    b_jobs = (SubmitRequest("true", pool="B") for _ in range(40))
    theirs = [s.key for s in Submitter(ws).submit(b_jobs)]
    job_id = theirs[0][:2] + new_id()[2:]  # into the shard of one of B's jobs
    mine = next(iter(Submitter(ws).submit([SubmitRequest("true", pool="A", job_id=job_id)])))
    held = locate_key(ws, mine.placement, mine.key)
    assert held is not None and steering.pause(ws, held).after is State.PAUSED
    config = ManagerConfig(
        workers=2, pools=("A",), exit_when_idle=exit_when_idle, poll_interval=0.05, verbose=False
    )
    manager = Manager(ws, config)
    shard = ws.state_dir(State.READY, mine.placement)
    late: dict[str, object] = {}

    def resume_late() -> None:
        late["settled"] = manager.claim.stream.settled(shard)
        other = Workspace.open(ws.root)
        paused = locate_key(other, mine.placement, mine.key)
        assert paused is not None
        late["state"] = steering.resume(other, paused).after
        other.close()

    timer = threading.Timer(resume_at, resume_late)
    watchdog = threading.Timer(60, lambda: setattr(manager.drain, "exit_now", True))
    timer.start()
    watchdog.start()
    try:
        with manager_in_this_process():
            rc = manager.run(install_signals=False)
    finally:
        timer.cancel()
        watchdog.cancel()
    seen = {
        **late,
        "rc": rc,
        "watchdog": manager.drain.exit_now,
        "succeeded": {h.key for h in walk_all(ws, State.SUCCEEDED)} == {mine.key},
        "ready": {h.key for h in walk_all(ws, State.READY)} == set(theirs),
    }
    ws.close()
    return seen


#: into a shard no longer listed; it ran, the others of B are left; the run stopped idle
RAN = {"settled": True, "state": State.READY, "rc": 0, "watchdog": False}
RAN |= {"succeeded": True, "ready": True}


def test_an_idle_run_finds_a_job_of_its_pool_among_shards_it_no_longer_lists(
    tmp_path: Path,
) -> None:
    assert _resumed_into_a_quiet_shard(tmp_path, exit_when_idle=6.0, resume_at=3.5) == RAN


def test_an_idle_run_lists_every_shard_before_it_stops_where_attributes_are_cached(
    tmp_path: Path,
) -> None:
    """A client of a shared filesystem may cache a directory's attributes for a minute
    (NFS): a rename into a shard that the idle checks stat, rather than list, goes unseen
    by the stat. The stop is decided on a listing of every shard: the job resumed into
    one runs, and the run stops idle with nothing left."""
    model = StaleDirStats(hold=600.0)
    set_filesystem(model)
    assert _resumed_into_a_quiet_shard(tmp_path, exit_when_idle=6.0, resume_at=3.5) == RAN
    assert model.stale > 0  # a stat answered from the cache after the rename
