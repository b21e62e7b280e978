"""Registration in batches: transition_many, register_many, and what a manager keeps
of its own frames (the ready frame it reads back at the claim)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import pytest
from helpers import markers_in

from httk_flow.errors import CorruptRecord, FlowError, IllegalTransition, TransitionConflict
from httk_flow.ops.depend import prepare
from httk_flow.protocol import jobs, programs
from httk_flow.protocol.after import AfterPolicy
from httk_flow.protocol.frames import Body
from httk_flow.protocol.journal import RawFrame
from httk_flow.protocol.names import RecordRef
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.transition import (
    JobHandle,
    Move,
    locate_key,
    transition,
    transition_many,
)
from httk_flow.protocol.workspace import Workspace


def _handles(ws: Workspace, submitter: Submitter, n: int, **kw: object) -> list[JobHandle]:
    kw.setdefault("program", "true")
    specs = submitter.submit([SubmitRequest(**kw) for _ in range(n)])  # type: ignore[arg-type]
    out = []
    for s in specs:
        h = locate_key(ws, s.placement, s.key)
        assert h is not None
        out.append(h)
    return out


class _Appends:
    """Counts the journal appends of a workspace's writer (the real appends still run)."""

    def __init__(self, ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sizes: list[int] = []
        writer = ws.writer
        real = writer.append_many

        def counted(frames: Sequence[RawFrame]) -> list[RecordRef]:
            self.sizes.append(len(frames))
            return real(frames)

        monkeypatch.setattr(writer, "append_many", counted)


def test_transition_many_appends_once_and_renames_each(
    ws: Workspace, submitter: Submitter, monkeypatch: pytest.MonkeyPatch
) -> None:
    hs = _handles(ws, submitter, 5, placement="b")
    appends = _Appends(ws, monkeypatch)
    seen: list[tuple[str, str]] = []
    ws.on_transition.append(lambda old, new, frame, note: seen.append((old.key, new.state.value)))

    out = transition_many(ws, [Move(h, State.READY, Body(why="batch")) for h in hs], actor="m")

    assert appends.sizes == [5]
    assert all(isinstance(r, JobHandle) and r.state is State.READY for r in out)
    assert len(markers_in(ws, State.READY)) == 5 and markers_in(ws, State.SUBMITTED) == []
    assert seen == [(h.key, "ready") for h in hs]  # told after the move, in order
    for h, r in zip(hs, out, strict=True):
        assert isinstance(r, JobHandle)
        frame = ws.reader.frame(r.marker.ref)
        assert (frame.key, frame.source, frame.to, frame.by) == (
            h.key,
            State.SUBMITTED,
            State.READY,
            "m",
        )
        assert frame.prev == h.marker.ref and frame.gen == h.marker.generation + 1
        assert frame.body.why == "batch"


def test_a_lost_race_in_the_middle_of_a_batch_costs_only_that_job(
    ws: Workspace, submitter: Submitter
) -> None:
    hs = _handles(ws, submitter, 3)
    rival = Workspace.open(ws.root)
    try:
        [won] = transition_many(rival, [Move(hs[1], State.READY, Body(why="rival"))], actor="r")
    finally:
        rival.close()
    assert isinstance(won, JobHandle)

    out = transition_many(ws, [Move(h, State.READY, Body()) for h in hs], actor="m")

    assert isinstance(out[0], JobHandle) and isinstance(out[2], JobHandle)
    assert isinstance(out[1], TransitionConflict)
    # the loser's frame is in the journal but no marker names it: the rival's stands
    now = locate_key(ws, hs[1].placement, hs[1].key)
    assert now is not None and now.marker == won.marker
    assert ws.reader.frame(now.marker.ref).by == "r"
    assert len(markers_in(ws, State.READY)) == 3


def test_an_illegal_move_in_a_batch_writes_nothing(ws: Workspace, submitter: Submitter) -> None:
    hs = _handles(ws, submitter, 2)
    moves = [Move(hs[0], State.READY, Body()), Move(hs[1], State.SUCCEEDED, Body())]
    before = _journal_bytes(ws)
    with pytest.raises(IllegalTransition):
        transition_many(ws, moves, actor="m")
    assert len(markers_in(ws, State.SUBMITTED)) == 2
    assert _journal_bytes(ws) == before


def _journal_bytes(ws: Workspace) -> int:
    return sum(
        os.path.getsize(os.path.join(d, f))
        for d, _, files in os.walk(ws.journal_dir)
        for f in files
    )


def test_transition_many_in_a_durable_workspace(tmp_path: object) -> None:
    root = os.path.join(str(tmp_path), "durable")
    ws = Workspace.create(root, durable=True)
    try:
        hs = _handles(ws, Submitter(ws, actor="s"), 4, placement="d/x")
        out = transition_many(ws, [Move(h, State.READY, Body()) for h in hs], actor="m")
        assert all(isinstance(r, JobHandle) for r in out)
        assert len(markers_in(ws, State.READY)) == 4
    finally:
        ws.close()


def test_register_many_batches_plain_jobs_and_handles_the_rest_one_by_one(
    ws: Workspace, submitter: Submitter, program: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = _handles(ws, submitter, 4, placement="p", program=program)
    held = _handles(ws, submitter, 1, placement="p", hold=True)
    broken = _handles(ws, submitter, 1, placement="p")
    with open(os.path.join(ws.job_dir("p", broken[0].key), "job.json"), "wb") as fh:
        fh.write(b'{"id": "torn')
    gone = _handles(ws, submitter, 1, placement="p", program=program)
    first = _handles(ws, submitter, 1, placement="p")
    deps = prepare(ws, (first[0].job_id,), AfterPolicy.OK, actor="t").after
    dependent = _handles(ws, submitter, 1, placement="p", after=deps)
    # the program of `gone` is the same stored program as `plain`'s: once it is removed,
    # every job naming it fails, so `gone` runs alone, in a call of its own, afterwards
    batch = plain + held + broken + first + dependent
    appends = _Appends(ws, monkeypatch)

    out = jobs.register_many(ws, batch, actor="m")

    assert [r.state if isinstance(r, JobHandle) else r for r in out] == [
        State.READY,
        State.READY,
        State.READY,
        State.READY,
        State.PAUSED,
        State.FAILED,
        State.READY,
        State.WAITING,
    ]
    # the six plain moves in one append; the failure and the dependent one each
    assert sorted(appends.sizes) == [1, 1, 6]
    failed = out[5]
    assert isinstance(failed, JobHandle)
    failure = jobs.current_frame(ws, failed).body.failure
    assert failure is not None and failure.code == "protocol_error"
    assert "job.json" in failure.message

    spec = jobs.load_spec(ws, "p", gone[0].key)
    assert spec.program.digest is not None
    os.unlink(ws.program_path(spec.program.digest))
    [lost] = jobs.register_many(ws, gone, actor="m")
    assert isinstance(lost, JobHandle) and lost.state is State.FAILED
    failure = jobs.current_frame(ws, lost).body.failure
    assert failure is not None and "program store" in failure.message


def test_register_many_reports_a_job_another_manager_registered(
    ws: Workspace, submitter: Submitter
) -> None:
    hs = _handles(ws, submitter, 3)
    jobs.register(ws, hs[0], actor="other")
    out = jobs.register_many(ws, hs, actor="m")
    assert isinstance(out[0], FlowError)
    assert isinstance(out[1], JobHandle) and isinstance(out[2], JobHandle)
    assert len(markers_in(ws, State.READY)) == 3


def test_a_batch_whose_append_fails_moves_none_and_says_so(
    ws: Workspace, submitter: Submitter, monkeypatch: pytest.MonkeyPatch
) -> None:
    hs = _handles(ws, submitter, 3)
    writer = ws.writer

    def full(frames: Sequence[RawFrame], *, keep: bool = False) -> list[RecordRef]:
        raise FlowError("cannot append to the journal (No space left on device)", obj="seg")

    monkeypatch.setattr(writer, "append_many", full)
    out = jobs.register_many(ws, hs, actor="m")
    assert all(isinstance(r, FlowError) and "No space" in str(r) for r in out)
    assert len(markers_in(ws, State.SUBMITTED)) == 3


def test_the_ready_frame_is_read_back_from_memory_and_only_that(
    ws: Workspace, submitter: Submitter
) -> None:
    [h] = _handles(ws, submitter, 1)
    [ready] = jobs.register_many(ws, [h], actor="m")
    assert isinstance(ready, JobHandle)
    claimed = transition(ws, ready, State.CLAIMED, Body(), actor="m")
    # empty the manager's segment: a frame kept in memory still reads, the others do not
    seg = os.path.join(ws.journal_dir, ready.marker.ref.writer, f"{ready.marker.ref.segment}.jsonl")
    os.truncate(seg, 0)
    assert ws.reader.frame(ready.marker.ref).to is State.READY
    with pytest.raises(CorruptRecord):
        ws.reader.frame(claimed.marker.ref)


def test_frames_kept_in_memory_are_bounded(ws: Workspace, submitter: Submitter) -> None:
    hs = _handles(ws, submitter, 5)
    ws.reader.RECENT = 2
    out = jobs.register_many(ws, hs, actor="m")
    refs = [r.marker.ref for r in out if isinstance(r, JobHandle)]
    seg = os.path.join(ws.journal_dir, refs[0].writer, f"{refs[0].segment}.jsonl")
    os.truncate(seg, 0)
    for ref in refs[-2:]:
        assert ws.reader.frame(ref).to is State.READY
    for ref in refs[:-2]:
        with pytest.raises(CorruptRecord):
            ws.reader.frame(ref)


def test_a_program_seen_once_is_not_looked_up_again_in_the_same_pass(
    ws: Workspace, submitter: Submitter, program: str
) -> None:
    [h] = _handles(ws, submitter, 1, program=program)
    spec = jobs.load_spec(ws, h.placement, h.key)
    assert spec.program.digest is not None
    present: set[str] = set()
    assert programs.missing(ws, spec.program, present) is None
    os.unlink(ws.program_path(spec.program.digest))
    assert programs.missing(ws, spec.program, present) is None  # remembered
    assert programs.missing(ws, spec.program, set()) is not None  # a new pass looks
    assert programs.missing(ws, spec.program) is not None


def test_register_many_moves_a_batch_at_a_time_and_the_last_partial_one(
    ws: Workspace, submitter: Submitter, monkeypatch: pytest.MonkeyPatch
) -> None:
    hs = _handles(ws, submitter, 7, placement="q")
    broken = _handles(ws, submitter, 1, placement="q")
    with open(os.path.join(ws.job_dir("q", broken[0].key), "job.json"), "wb") as fh:
        fh.write(b"[]")
    monkeypatch.setattr(jobs, "REGISTER_BATCH", 3)
    appends = _Appends(ws, monkeypatch)

    # the broken job last: its one-by-one failure must not strand the partial batch
    out = jobs.register_many(ws, hs + broken, actor="m")

    assert [r.state if isinstance(r, JobHandle) else r for r in out] == [State.READY] * 7 + [
        State.FAILED
    ]
    assert appends.sizes == [3, 3, 1, 1]  # the failure's own frame came before the last 1
    assert markers_in(ws, State.SUBMITTED) == []
