"""transition: one verified rename of the exact current marker, resolved after any error."""

from __future__ import annotations

import errno
import os

import pytest
from helpers import markers_in

from httk_flow.errors import FlowError, IllegalTransition, TransitionConflict
from httk_flow.protocol import fsio
from httk_flow.protocol.frames import Body
from httk_flow.protocol.names import Marker
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.transition import JobHandle, locate_key, transition
from httk_flow.protocol.workspace import Workspace


def _submitted(ws: Workspace, submitter: Submitter, placement: str = "t/one") -> JobHandle:
    [spec] = submitter.submit([SubmitRequest(program="true", placement=placement)])
    handle = locate_key(ws, spec.placement, spec.key)
    assert handle is not None and handle.state is State.SUBMITTED
    return handle


def test_a_transition_renames_the_marker_and_appends_a_frame_naming_the_previous(
    ws: Workspace, submitter: Submitter
) -> None:
    job = _submitted(ws, submitter)
    first = ws.reader.frame(job.marker.ref)
    ready = transition(ws, job, State.READY, first.body.carry(why="hi"), actor="mgr-1")

    assert not os.path.exists(job.path(ws))
    assert os.path.isfile(ready.path(ws))
    assert ready.state is State.READY and ready.placement == job.placement
    assert ready.marker.generation == 1 and ready.marker.key == job.key
    assert markers_in(ws, State.SUBMITTED) == []
    assert markers_in(ws, State.READY) == [f"t/one/{ready.marker.name}"]

    frame = ws.reader.read(ready.marker.ref)
    assert frame["prev"] == str(job.marker.ref)
    assert (frame["from"], frame["to"], frame["gen"], frame["by"]) == (
        "submitted",
        "ready",
        1,
        "mgr-1",
    )
    assert frame["job"] == job.job_id and frame["placement"] == "t/one"
    assert frame["why"] == "hi"
    assert frame["step"] == first.snap.step == "main"  # carried forward
    assert [f["to"] for f in ws.reader.chain_json(ready.marker.ref)] == ["ready", "submitted"]


def test_priority_and_not_before_travel_in_the_new_marker_name(
    ws: Workspace, submitter: Submitter
) -> None:
    job = _submitted(ws, submitter)
    ready = transition(ws, job, State.READY, Body(), actor="a")
    later = transition(
        ws, ready, State.READY, Body(), actor="a", priority=17, not_before=2_000_000_000
    )
    parsed = Marker.from_name(os.path.basename(later.path(ws)))
    assert (parsed.priority, parsed.not_before, parsed.generation) == (17, 2_000_000_000, 2)


def test_an_illegal_transition_is_refused_before_anything_is_written(
    ws: Workspace, submitter: Submitter
) -> None:
    job = _submitted(ws, submitter)
    segment = os.path.join(ws.journal_dir, ws.writer.writer_id, "0.jsonl")
    size = os.path.getsize(segment)
    with pytest.raises(IllegalTransition):
        transition(ws, job, State.RUNNING, Body(), actor="a")
    assert os.path.isfile(job.path(ws))
    assert os.path.getsize(segment) == size


def test_a_transition_out_of_a_permanent_state_is_illegal(
    ws: Workspace, submitter: Submitter
) -> None:
    job = transition(ws, _submitted(ws, submitter), State.CANCELLED, Body(), actor="a")
    for target in State:
        with pytest.raises(IllegalTransition):
            transition(ws, job, target, Body(), actor="a")


def test_losing_the_race_for_a_marker_raises_transition_conflict(
    ws: Workspace, submitter: Submitter
) -> None:
    job = transition(ws, _submitted(ws, submitter), State.READY, Body(), actor="a")
    winner = transition(ws, job, State.CLAIMED, Body(), actor="winner")
    with pytest.raises(TransitionConflict) as info:
        transition(ws, job, State.CLAIMED, Body(), actor="loser")  # a stale handle
    assert "claimed" in str(info.value)
    assert markers_in(ws, State.CLAIMED) == [f"t/one/{winner.marker.name}"]
    assert ws.reader.read(winner.marker.ref)["by"] == "winner"


def test_two_workspaces_racing_for_one_marker_produce_one_winner(
    ws: Workspace, submitter: Submitter
) -> None:
    job = transition(ws, _submitted(ws, submitter), State.READY, Body(), actor="a")
    other = Workspace.open(ws.root)  # another process's view: its own journal writer
    won = transition(other, job, State.CLAIMED, Body(), actor="other")
    with pytest.raises(TransitionConflict):
        transition(ws, job, State.CLAIMED, Body(), actor="me")
    assert ws.writer.writer_id != other.writer.writer_id
    assert locate_key(ws, job.placement, job.key) == won
    other.close()


class _LyingRename(fsio.FileSystem):
    """An NFS retransmit: the rename happened, but the client was told it failed."""

    def __init__(self) -> None:
        self.calls = 0

    def rename(self, src: str, dst: str) -> None:
        self.calls += 1
        os.rename(src, dst)
        raise OSError(errno.ENOENT, "No such file or directory (retransmitted)")


class _FailingRename(fsio.FileSystem):
    def rename(self, src: str, dst: str) -> None:
        raise OSError(errno.EACCES, "Permission denied")


def test_a_rename_that_reports_an_error_although_it_happened_is_resolved_as_won(
    ws: Workspace, submitter: Submitter
) -> None:
    job = _submitted(ws, submitter)
    lying = _LyingRename()
    fsio.set_filesystem(lying)
    ready = transition(ws, job, State.READY, Body(), actor="a")
    assert lying.calls >= 1  # one more when the target directory had to be made first
    assert os.path.isfile(ready.path(ws))
    assert not os.path.exists(job.path(ws))
    assert locate_key(ws, job.placement, job.key) == ready


def test_a_rename_that_failed_with_the_source_still_present_is_reported_not_guessed(
    ws: Workspace, submitter: Submitter
) -> None:
    job = _submitted(ws, submitter)
    fsio.set_filesystem(_FailingRename())
    with pytest.raises(FlowError) as info:
        transition(ws, job, State.READY, Body(), actor="a")
    assert not isinstance(info.value, TransitionConflict)
    assert "Permission denied" in str(info.value)
    assert os.path.isfile(job.path(ws))


def test_a_marker_that_vanished_without_a_successor_stops_the_actor(
    ws: Workspace, submitter: Submitter
) -> None:
    job = _submitted(ws, submitter)
    os.unlink(job.path(ws))
    with pytest.raises(FlowError) as info:
        transition(ws, job, State.READY, Body(), actor="a")
    assert not isinstance(info.value, TransitionConflict)
    assert "flow fsck" in str(info.value)


class _ListsLate(fsio.FileSystem):
    """An NFS client's view: it may list a directory as it was up to a minute ago."""

    def caches_attributes(self, path: str) -> bool:
        return True


def test_a_marker_gone_where_listings_lag_is_a_lost_race_not_a_fault(
    ws: Workspace, submitter: Submitter
) -> None:
    # there another host's rename may have put it where this one cannot list it yet: the
    # actor must act on nothing, and not send the user to fsck for a job that is fine
    job = _submitted(ws, submitter)
    os.unlink(job.path(ws))
    fsio.set_filesystem(_ListsLate())
    with pytest.raises(TransitionConflict, match="does not list yet"):
        transition(ws, job, State.READY, Body(), actor="a")
    assert locate_key(ws, job.placement, job.key) is None  # and it made nothing


def test_a_target_directory_removed_under_a_cached_workspace_is_recreated(
    ws: Workspace, submitter: Submitter
) -> None:
    a = transition(ws, _submitted(ws, submitter, "gc/here"), State.READY, Body(), actor="a")
    b = transition(ws, _submitted(ws, submitter, "gc/here"), State.READY, Body(), actor="a")
    a = transition(ws, a, State.CLAIMED, Body(), actor="a")
    a = transition(ws, a, State.READY, Body(), actor="a")
    # the claimed/gc/here directory is now empty and known to this process; collect it
    os.rmdir(ws.state_dir(State.CLAIMED, "gc/here"))
    b = transition(ws, b, State.CLAIMED, Body(), actor="a")
    assert os.path.isfile(b.path(ws))


def test_locate_key_finds_the_marker_in_any_state_and_ignores_similar_names(
    ws: Workspace, submitter: Submitter
) -> None:
    job = _submitted(ws, submitter)
    assert locate_key(ws, job.placement, job.key) == job
    assert locate_key(ws, job.placement, "0" * 32) is None
    assert locate_key(ws, "t/elsewhere", job.key) is None
    # stray files that start like the key are not mistaken for its marker
    stray = ws.state_dir(State.READY, job.placement)
    os.makedirs(stray)
    for name in (job.key + ".junk", job.key + ".p500.g1.not-a-ref"):
        with open(os.path.join(stray, name), "w"):
            pass
    assert locate_key(ws, job.placement, job.key) == job
