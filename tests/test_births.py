"""Fenced births (protocol.md §6): a job's marker is born inside its payload and moved
out by one rename, so two registrants of one job, or one that wakes late after the job
moved on, can never give it a second marker.

The races are choreographed at the rename boundary through the filesystem seam: the
late registrant is paused exactly where a freeze or a slow node would pause it, the
other registrant runs to the end, and the job moves on, before the late one resumes.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from httk_flow.errors import InvalidName
from httk_flow.manager.decide import MAX_MANAGER_DEATHS, Ending, decide
from httk_flow.protocol import fsio, names
from httk_flow.protocol.frames import Snapshot
from httk_flow.protocol.jobspec import ParentRef
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.transition import locate_key, transition
from httk_flow.protocol.workspace import Workspace


class _PauseAt(fsio.FileSystem):
    """Runs `meanwhile` once, just before the first rename whose source matches `when`."""

    def __init__(self, when: Callable[[str, str], bool], meanwhile: Callable[[], None]) -> None:
        self.when, self.meanwhile, self.fired = when, meanwhile, False

    def rename(self, src: str, dst: str) -> None:
        if not self.fired and self.when(src, dst):
            self.fired = True
            self.meanwhile()
        super().rename(src, dst)


def _markers(ws: Workspace, job_id: str) -> list[str]:
    out = []
    for d, _, files in os.walk(ws.state_root):
        out += [os.path.join(d, f) for f in files if job_id in f]
    return out


def _child(job_id: str) -> SubmitRequest:
    parent = ParentRef("0" * 32, "0" * 32, "kids", 1, "x")
    return SubmitRequest(program="true", job_id=job_id, placement="kids/p", parent=parent)


def _move_on(ws: Workspace, job_id: str) -> None:
    """The job registers and is claimed: its marker leaves submitted/."""
    h = locate_key(ws, "kids/p", job_id)
    assert h is not None
    body = ws.reader.frame(h.marker.ref).body
    h = transition(ws, h, State.READY, body.carry(), actor="other")
    transition(ws, h, State.CLAIMED, body.carry(), actor="other")


@pytest.mark.parametrize("pause", ["before_payload", "before_birth_move"])
def test_a_late_registrant_never_gives_a_job_a_second_marker(ws: Workspace, pause: str) -> None:
    job_id = names.new_id()
    other = Submitter(ws, actor="other")

    def meanwhile() -> None:
        # another registrant publishes the job completely, and the job moves on
        list(other.submit([_child(job_id)], idempotent=True))
        _move_on(ws, job_id)

    prefix = f"job-{job_id}" if pause == "before_payload" else names.BIRTH_PREFIX

    def when(src: str, dst: str) -> bool:
        return os.path.basename(src).startswith(prefix)

    previous = fsio.set_filesystem(_PauseAt(when, meanwhile))
    try:
        list(Submitter(ws, actor="late").submit([_child(job_id)], idempotent=True))
    finally:
        fsio.set_filesystem(previous)
    found = _markers(ws, job_id)
    assert len(found) == 1, found
    assert f"{os.sep}claimed{os.sep}" in found[0]
    job_dir = ws.job_dir("kids/p", job_id)
    assert not [n for n in os.listdir(job_dir) if n.startswith(names.BIRTH_PREFIX)]
    assert not [n for n in os.listdir(ws.tmp) if job_id in n]  # the loser cleaned up


def test_a_replayed_registration_of_published_children_lists_each_job_dir_once(
    ws: Workspace,
) -> None:
    ids = [names.new_id() for _ in range(50)]
    list(Submitter(ws, actor="a").submit([_child(i) for i in ids], idempotent=True))

    class Counting(fsio.FileSystem):
        def __init__(self) -> None:
            self.listed: list[str] = []

        def scandir(self, path: str):  # type: ignore[no-untyped-def]
            self.listed.append(path)
            return super().scandir(path)

    counting = Counting()
    previous = fsio.set_filesystem(counting)
    try:
        list(Submitter(ws, actor="b").submit([_child(i) for i in ids], idempotent=True))
    finally:
        fsio.set_filesystem(previous)
    # O(1) per child: its own directory, never the state kinds of its placement
    assert len(counting.listed) == len(ids)
    # a first registration knows its birth markers' names: it lists no job directory
    fresh = [names.new_id() for _ in range(50)]
    counting.listed.clear()
    previous = fsio.set_filesystem(counting)
    try:
        list(Submitter(ws, actor="c").submit([_child(i) for i in fresh], idempotent=True))
    finally:
        fsio.set_filesystem(previous)
    assert counting.listed == []
    assert all(len(_markers(ws, i)) == 1 for i in fresh)
    assert all(len(_markers(ws, i)) == 1 for i in ids)


def test_a_submitted_placement_leaves_room_for_its_jobs_children(submitter: Submitter) -> None:
    deep = "/".join(["d"] * 16)
    with pytest.raises(InvalidName, match="children live one level below"):
        submitter.build(SubmitRequest(program="true", placement=deep))
    submitter.build(SubmitRequest(program="true", placement="/".join(["d"] * 15)))
    long = "/".join(["x" * 100] * 4) + "/" + "y" * 20  # 424 characters
    with pytest.raises(InvalidName, match="at most 413"):
        submitter.build(SubmitRequest(program="true", placement=long))


def test_a_job_is_failed_after_consecutive_manager_deaths_and_a_normal_end_resets_it(
    submitter: Submitter,
) -> None:
    spec = submitter.build(SubmitRequest(program="true", retries=5))
    snap = Snapshot(step="main", act=1, try_=1, tries=1)
    died = Ending(None, None, interrupted=True, owner_died=True)
    for n in range(1, MAX_MANAGER_DEATHS):
        d = decide(spec, snap, died, now=0.0, backoff_base=1, backoff_cap=1)
        assert d.target is State.READY and d.changes.deaths == n
        snap = d.changes.snapshot(snap).but(try_=1, tries=n + 1)
    d = decide(spec, snap, died, now=0.0, backoff_base=1, backoff_cap=1)
    assert d.target is State.FAILED
    assert d.changes.failure is not None and d.changes.failure.code == "manager_deaths"
    # a drain (the manager lived) or an ordinary end breaks the run of deaths
    drained = Ending(None, None, interrupted=True, drained=True)
    d = decide(spec, snap, drained, now=0.0, backoff_base=1, backoff_cap=1)
    assert d.target is State.READY and d.changes.deaths == 0
    ok = decide(spec, snap, Ending(0), now=0.0, backoff_base=1, backoff_cap=1)
    assert ok.target is State.SUCCEEDED and ok.changes.deaths == 0
    # a takeover after a clean goodbye is an interruption, not a death
    quiet = Ending(None, None, interrupted=True)
    d = decide(spec, snap, quiet, now=0.0, backoff_base=1, backoff_cap=1)
    assert d.target is State.READY and d.changes.snapshot(snap).deaths == 0
