"""jobs: finding a job by what a user types, registering it, and reading its history."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from helpers import markers_in

from httk_flow.errors import InvalidJob, JobNotFound
from httk_flow.ops import lookup
from httk_flow.protocol import jobs
from httk_flow.protocol.frames import AttemptRecord, Body, Frame, Result, Snapshot
from httk_flow.protocol.jobspec import JobSpec
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.transition import JobHandle, locate_key, transition
from httk_flow.protocol.workspace import Workspace


def _submit(submitter: Submitter, **kw: object) -> JobSpec:
    kw.setdefault("program", "true")
    [spec] = submitter.submit([SubmitRequest(**kw)])  # type: ignore[arg-type]
    return spec


def _handle(ws: Workspace, spec: JobSpec) -> JobHandle:
    h = locate_key(ws, spec.placement, spec.key)
    assert h is not None
    return h


@pytest.fixture
def population(ws: Workspace, submitter: Submitter) -> dict[str, JobSpec]:
    return {
        "plain": _submit(submitter),
        "tagged": _submit(submitter, tag="unique-tag"),
        "placed": _submit(submitter, placement="campaign/x"),
        "placed_tagged": _submit(submitter, placement="campaign/y", tag="solo"),
        "twin1": _submit(submitter, tag="twin"),
        "twin2": _submit(submitter, tag="twin"),
    }


#: the jobs of `population` without a twin
SINGLES = ["plain", "tagged", "placed", "placed_tagged"]

#: what a user may type to name a job: its id (white space around it ignored), its key, or
#: a prefix of its id of eight or more characters
TYPED: dict[str, Callable[[JobSpec], str]] = {
    "id": lambda spec: spec.id,
    "padded_id": lambda spec: f"  {spec.id}\n",
    "key": lambda spec: spec.key,
    "prefix_8": lambda spec: spec.id[:8],
    "prefix_12": lambda spec: spec.id[:12],
    "prefix_31": lambda spec: spec.id[:31],
}


@pytest.mark.parametrize(
    ("which", "typed"),
    [(which, typed) for typed in ("id", "padded_id", "key") for which in SINGLES]
    + [(which, f"prefix_{n}") for n in (8, 12, 31) for which in ("plain", "placed_tagged")],
)
def test_a_job_is_found_by_its_id_its_key_or_an_id_prefix_of_eight_or_more_characters(
    ws: Workspace, population: dict[str, JobSpec], which: str, typed: str
) -> None:
    spec = population[which]
    assert lookup.find(ws, TYPED[typed](spec)) == _handle(ws, spec)


def test_a_job_is_found_by_a_tag_that_names_exactly_one_job(
    ws: Workspace, population: dict[str, JobSpec]
) -> None:
    assert lookup.find(ws, "unique-tag") == _handle(ws, population["tagged"])
    assert lookup.find(ws, "solo") == _handle(ws, population["placed_tagged"])


def test_a_tag_shared_by_two_jobs_is_ambiguous(
    ws: Workspace, population: dict[str, JobSpec]
) -> None:
    with pytest.raises(JobNotFound) as info:
        lookup.find(ws, "twin")
    text = str(info.value)
    assert "2 jobs" in text
    assert population["twin1"].key in text and population["twin2"].key in text


def test_an_id_prefix_shared_by_two_jobs_is_ambiguous(ws: Workspace, submitter: Submitter) -> None:
    a = _submit(submitter, job_id="deadbeef" + "0" * 24)
    b = _submit(submitter, job_id="deadbeef" + "1" * 24, placement="elsewhere")
    with pytest.raises(JobNotFound) as info:
        lookup.find(ws, "deadbeef")
    assert "2 jobs" in str(info.value)
    assert lookup.find(ws, "deadbeef0") == _handle(ws, a)
    assert lookup.find(ws, "deadbeef1") == _handle(ws, b)


@pytest.mark.parametrize(
    "ident",
    ["no-such-tag", "0123456789abcdef0123456789abcdef", "01234567", "zz--" + "a" * 32, "abc"],
)
def test_a_name_that_matches_no_job_is_reported(
    ws: Workspace, population: dict[str, JobSpec], ident: str
) -> None:
    with pytest.raises(JobNotFound) as info:
        lookup.find(ws, ident)
    assert "flow list" in str(info.value) or "8 characters" in str(info.value)


def test_a_job_is_found_in_whatever_state_it_is_in(ws: Workspace, submitter: Submitter) -> None:
    spec = _submit(submitter, tag="mover")
    h = transition(ws, _handle(ws, spec), State.READY, Body(), actor="t")
    h = transition(ws, h, State.PAUSED, Body(), actor="t")
    for ident in (spec.id, spec.id[:10], spec.key, "mover"):
        found = lookup.find(ws, ident)
        assert found.state is State.PAUSED and found == h


def test_register_moves_a_valid_job_to_ready_carrying_its_snapshot(
    ws: Workspace, submitter: Submitter
) -> None:
    spec = _submit(submitter, step="prepare")
    ready = jobs.register(ws, _handle(ws, spec), actor="mgr")
    assert ready.state is State.READY
    frame = jobs.current_frame(ws, ready)
    assert (frame.source, frame.to, frame.by) == (State.SUBMITTED, State.READY, "mgr")
    assert frame.snap == Snapshot(step="prepare", act=1, try_=0, tries=0)


def test_a_corrupt_job_json_fails_its_job_with_protocol_error_and_spares_the_others(
    ws: Workspace, submitter: Submitter
) -> None:
    specs = [_submit(submitter, placement="batch") for _ in range(5)]
    broken = specs[2]
    with open(os.path.join(ws.job_dir("batch", broken.key), "job.json"), "wb") as fh:
        fh.write(b'{"id": "truncated')
    results = {s.key: jobs.register(ws, _handle(ws, s), actor="mgr") for s in specs}
    assert results[broken.key].state is State.FAILED
    failure = jobs.current_frame(ws, results[broken.key]).body.failure
    assert failure is not None
    assert failure.code == "protocol_error"
    assert failure.retryable is False
    assert "job.json" in failure.message
    for s in specs:
        if s is not broken:
            assert results[s.key].state is State.READY
    assert len(markers_in(ws, State.READY)) == 4
    assert len(markers_in(ws, State.FAILED)) == 1
    assert markers_in(ws, State.SUBMITTED) == []


@pytest.mark.parametrize("damage", ["missing", "wrong_key", "symlink", "missing_program"])
def test_other_kinds_of_broken_payload_also_fail_with_protocol_error(
    ws: Workspace, submitter: Submitter, program: str, damage: str
) -> None:
    spec = _submit(submitter, placement="b", program=program)
    other = _submit(submitter, placement="b")
    path = os.path.join(ws.job_dir("b", spec.key), "job.json")
    if damage == "missing":
        os.unlink(path)
    elif damage == "wrong_key":
        os.replace(os.path.join(ws.job_dir("b", other.key), "job.json"), path)
    elif damage == "symlink":
        os.rename(path, path + ".real")
        os.symlink(path + ".real", path)
    else:
        assert spec.program.digest is not None
        os.unlink(ws.program_path(spec.program.digest))
    failed = jobs.register(ws, _handle(ws, spec), actor="mgr")
    assert failed.state is State.FAILED
    failure = jobs.current_frame(ws, failed).body.failure
    assert failure is not None and failure.code == "protocol_error"


def test_view_lists_the_history_oldest_first(ws: Workspace, submitter: Submitter) -> None:
    spec = _submit(submitter, tag="hist")
    h = jobs.register(ws, _handle(ws, spec), actor="mgr")
    f = jobs.current_frame(ws, h).body
    h = transition(ws, h, State.CLAIMED, f.carry(), actor="mgr")
    f = jobs.current_frame(ws, h).body
    attempt = AttemptRecord(n=1, id="a1", manager="mgr", host="h", step="main", pid=123)
    h = transition(ws, h, State.RUNNING, f.carry(attempt=attempt), actor="mgr")
    f = jobs.current_frame(ws, h).body
    h = transition(ws, h, State.COMMITTING, f.carry(attempt=attempt), actor="mgr")
    f = jobs.current_frame(ws, h).body
    h = transition(
        ws, h, State.SUCCEEDED, f.carry(attempt=attempt, result=Result(exit=0)), actor="mgr"
    )
    view = lookup.view(ws, h)
    assert [fr.to.value for fr in view.frames] == [
        "submitted",
        "ready",
        "claimed",
        "running",
        "committing",
        "succeeded",
    ]
    assert [fr.gen for fr in view.frames] == [0, 1, 2, 3, 4, 5]
    assert view.frame == view.frames[-1]
    assert view.spec == spec and view.spec_error is None
    assert [Frame.from_json(f) for f in jobs.history_json(ws, h)] == view.frames
    [att] = view.attempts
    assert att.record.id == "a1" and att.state is State.SUCCEEDED
    assert att.result == Result(exit=0) and att.started is not None and att.ended is not None


def test_view_of_a_job_with_a_broken_definition_still_shows_its_history(
    ws: Workspace, submitter: Submitter
) -> None:
    spec = _submit(submitter)
    with open(os.path.join(ws.job_dir(spec.placement, spec.key), "job.json"), "wb") as fh:
        fh.write(b"[]")
    h = jobs.register(ws, _handle(ws, spec), actor="mgr")
    view = lookup.view(ws, h)
    assert view.spec is None and view.spec_error is not None
    assert [fr.to.value for fr in view.frames] == ["submitted", "failed"]


def test_all_jobs_streams_every_marker_of_the_requested_states(
    ws: Workspace, submitter: Submitter
) -> None:
    specs = list(submitter.submit([SubmitRequest(program="true") for _ in range(30)]))
    for s in specs[:10]:
        jobs.register(ws, _handle(ws, s), actor="mgr")
    assert len(list(jobs.all_jobs(ws))) == 30
    assert len(list(jobs.all_jobs(ws, (State.READY,)))) == 10
    assert {h.key for h in jobs.all_jobs(ws, (State.SUBMITTED,))} == {s.key for s in specs[10:]}


def test_load_spec_refuses_a_definition_that_does_not_match_its_directory(
    ws: Workspace, submitter: Submitter
) -> None:
    spec = _submit(submitter, placement="here")
    os.makedirs(os.path.join(ws.root, "there"))
    os.rename(ws.job_dir("here", spec.key), ws.job_dir("there", spec.key))
    with pytest.raises(InvalidJob):
        jobs.load_spec(ws, "there", spec.key)


def test_a_tag_made_only_of_hex_digits_still_names_its_job(
    ws: Workspace, submitter: Submitter
) -> None:
    spec = _submit(submitter, tag="20240611")  # a date: as natural a tag as any
    assert lookup.find(ws, "20240611") == _handle(ws, spec)
