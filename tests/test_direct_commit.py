"""The direct commit (protocol.md §10): a plain success of the manager's own attempt goes
running -> succeeded in one frame that holds the whole commit; every other decision keeps
its two renames; a job moved meanwhile is fenced as before."""

from __future__ import annotations

import io
import os

import pytest

from httk_flow.errors import TransitionConflict
from httk_flow.manager.commit import Committer
from httk_flow.manager.decide import Ending
from httk_flow.manager.log import ManagerLog
from httk_flow.manager.tidy import Tidy
from httk_flow.protocol import jobs, layout
from httk_flow.protocol.frames import AttemptRecord, Body, Evidence
from httk_flow.protocol.jobspec import JobSpec
from httk_flow.protocol.outcome import Action, Outcome
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.transition import JobHandle, locate_key, transition
from httk_flow.protocol.workspace import Workspace

ACTOR = "mdirect"


def _running(ws: Workspace, submitter: Submitter, **kw: object) -> tuple[JobSpec, JobHandle, Body]:
    """A submitted job walked to running by ACTOR, with its attempt directory made."""
    [spec] = submitter.submit([SubmitRequest(program="true", **kw)])  # type: ignore[arg-type]
    h = locate_key(ws, spec.placement, spec.key)
    assert h is not None
    h = jobs.register(ws, h, actor=ACTOR)
    body = jobs.current_frame(ws, h).body
    h = transition(ws, h, State.CLAIMED, body.carry(), actor=ACTOR)
    attempt = AttemptRecord(n=1, id="a1", manager=ACTOR, host="h", step="main", pid=1)
    running = jobs.current_frame(ws, h).body.carry(attempt=attempt)
    h = transition(ws, h, State.RUNNING, running, actor=ACTOR)
    os.makedirs(layout.attempt_dir(ws.job_dir(spec.placement, spec.key), 1))
    return spec, h, running


def _committer(ws: Workspace) -> Committer:
    return Committer(ws, ACTOR, ManagerLog(ACTOR, stream=io.StringIO()))


def _tidy(ws: Workspace, spec: JobSpec) -> Tidy:
    return Tidy(
        ws.job_dir(spec.placement, spec.key),
        layout.attempt_name(1),
        persistent=False,
        settled=True,
        job=spec.id,
        key=spec.key,
        placement=spec.placement,
    )


def _moves(ws: Workspace, h: JobHandle) -> list[tuple[str | None, str]]:
    return [(f.source.value if f.source else None, f.to.value) for f in jobs.history(ws, h)]


def test_a_plain_success_is_one_move_whose_frame_holds_the_whole_commit(
    ws: Workspace, submitter: Submitter
) -> None:
    spec, h, running = _running(ws, submitter)
    said = Outcome(Action.SUCCEED, message="done")
    final = _committer(ws).commit(h, spec, running, Ending(0, outcome=said, elapsed=0.25))
    assert final.state is State.SUCCEEDED
    assert _moves(ws, final)[-2:] == [("claimed", "running"), ("running", "succeeded")]
    frame = jobs.current_frame(ws, final)
    assert frame.by == ACTOR and frame.gen == 4
    body = frame.body
    assert body.attempt is not None and body.attempt.id == "a1"
    assert body.result is not None and body.result.exit == 0 and body.result.elapsed == 0.25
    assert body.result.outcome == {"action": "succeed", "message": "done"}
    assert body.decision is not None and body.decision.target is State.SUCCEEDED
    assert body.message == "done" and body.why == "succeed"


@pytest.mark.parametrize(
    ("ending", "target"),
    [
        (Ending(0, outcome=Outcome(Action.FAIL, code="bad")), State.FAILED),
        (Ending(0, outcome=Outcome(Action.ADVANCE, step="two")), State.READY),
        (Ending(3), State.READY),  # a process failure with retries left
    ],
    ids=["fail", "advance", "process-failure"],
)
def test_every_other_decision_keeps_its_two_moves(
    ws: Workspace, submitter: Submitter, ending: Ending, target: State
) -> None:
    spec, h, running = _running(ws, submitter, retries=2)
    final = _committer(ws).commit(h, spec, running, ending)
    assert final.state is target
    assert _moves(ws, final)[-2:] == [("running", "committing"), ("committing", target.value)]


def test_a_success_committed_by_a_taker_keeps_its_two_moves(
    ws: Workspace, submitter: Submitter
) -> None:
    spec, h, running = _running(ws, submitter)
    proof = Evidence(owner="mgone", evidence="lease_expired")
    final = _committer(ws).commit(h, spec, running, Ending(0), evidence=proof)
    assert final.state is State.SUCCEEDED
    assert _moves(ws, final)[-2:] == [("running", "committing"), ("committing", "succeeded")]


def test_a_job_cancelled_before_its_direct_commit_is_fenced(
    ws: Workspace, submitter: Submitter
) -> None:
    spec, h, running = _running(ws, submitter)
    cancelling = transition(ws, h, State.CANCELLING, running.carry(), actor="cli-1")
    with pytest.raises(TransitionConflict):
        _committer(ws).commit(h, spec, running, Ending(0))
    now = locate_key(ws, spec.placement, spec.key)
    assert now is not None and now.marker == cancelling.marker
    assert _moves(ws, now)[-1] == ("running", "cancelling")


def test_the_attempt_is_tidied_only_after_the_rename(ws: Workspace, submitter: Submitter) -> None:
    spec, h, running = _running(ws, submitter)
    attempt = layout.attempt_dir(ws.job_dir(spec.placement, spec.key), 1)
    with open(layout.outcome_line(attempt), "w") as fh:
        fh.write('{"action": "succeed"}\n')
    for name in (layout.stdout_file(attempt), layout.stderr_file(attempt)):
        open(name, "w").close()
    # fenced: the rename fails, so nothing of the attempt may go (its outcome is evidence)
    transition(ws, h, State.CANCELLING, running.carry(), actor="cli-1")
    with pytest.raises(TransitionConflict):
        _committer(ws).commit(h, spec, running, Ending(0), tidy=_tidy(ws, spec))
    assert sorted(os.listdir(attempt)) == ["outcome.line", "stderr", "stdout"]
    # a second job, committed: its attempt directory is gone with everything in it
    spec2, h2, running2 = _running(ws, submitter)
    attempt2 = layout.attempt_dir(ws.job_dir(spec2.placement, spec2.key), 1)
    with open(layout.outcome_line(attempt2), "w") as fh:
        fh.write('{"action": "succeed"}\n')
    out = Outcome(Action.SUCCEED)
    final = _committer(ws).commit(
        h2, spec2, running2, Ending(0, outcome=out), tidy=_tidy(ws, spec2)
    )
    assert final.state is State.SUCCEEDED
    assert not os.path.exists(attempt2)
    assert sorted(os.listdir(ws.job_dir(spec2.placement, spec2.key))) == ["job.json"]


def test_a_pause_the_program_asks_for_is_not_direct(ws: Workspace, submitter: Submitter) -> None:
    spec, h, running = _running(ws, submitter)
    paused = Outcome(Action.PAUSE)
    final = _committer(ws).commit(h, spec, running, Ending(0, outcome=paused))
    assert final.state is State.PAUSED
    assert _moves(ws, final)[-2:] == [("running", "committing"), ("committing", "paused")]
