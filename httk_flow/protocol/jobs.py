"""Reading a job back: its definition, frames and attempt directories; registration;
failing a job."""

from __future__ import annotations

import os
from collections.abc import Iterator

from httk_flow.errors import FlowError, InvalidJob
from httk_flow.protocol import layout, programs
from httk_flow.protocol.after import verdict
from httk_flow.protocol.discovery import walk_all
from httk_flow.protocol.frames import Body, Failure, Frame
from httk_flow.protocol.fsio import fs
from httk_flow.protocol.jobspec import MAX_JOB_JSON, JobSpec
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle, transition
from httk_flow.protocol.workspace import Workspace


def find_attempt_dir(job_dir: str, n: int) -> str:
    """Attempt n's directory as a reader finds it: in the job directory (revision 6), else
    under attempts/ where a manager of revisions up to 5 made it (when it is there, and
    attempts/ is no symbolic link); the place of revision 6 when neither is, so that what
    says it is missing names it."""
    new = layout.attempt_dir(job_dir, n)
    if os.path.lexists(new):
        return new
    attempts = layout.attempts_dir(job_dir)
    old = os.path.join(attempts, layout.attempt_name(n))
    if os.path.lexists(old) and not os.path.islink(attempts):
        return old
    return new


def load_spec(ws: Workspace, placement: str, key: str) -> JobSpec:
    """Parse a job's job.json; InvalidJob/UnsafePath name the file when it is bad."""
    path = layout.job_file(ws.job_dir(placement, key))
    try:
        raw = fs.read_bytes(path, MAX_JOB_JSON)
    except FileNotFoundError:
        raise InvalidJob("is missing", obj=path) from None
    except OSError as e:
        raise InvalidJob(f"cannot be read ({e.strerror})", obj=path) from e
    spec = JobSpec.from_json(raw, path)
    if spec.key != key or spec.placement != placement:
        raise InvalidJob("does not match the job directory it lies in", obj=path)
    return spec


def current_frame(ws: Workspace, job: JobHandle) -> Frame:
    return ws.reader.frame(job.marker.ref)


def history(ws: Workspace, job: JobHandle) -> list[Frame]:
    """Every transition of the job, oldest first."""
    frames = list(ws.reader.chain(job.marker.ref))
    frames.reverse()
    return frames


def history_json(ws: Workspace, job: JobHandle) -> list[dict[str, object]]:
    """Every transition of the job as its frame was written, oldest first."""
    frames = list(ws.reader.chain_json(job.marker.ref))
    frames.reverse()
    return frames


def register(
    ws: Workspace, job: JobHandle, *, actor: str, specs: dict[str, JobSpec] | None = None
) -> JobHandle:
    """submitted -> ready after validating the definition; invalid -> failed(protocol_error).

    A manager passes `specs` to keep the parsed definition for its claim a moment later.
    """
    try:
        frame = current_frame(ws, job)
    except FlowError as e:
        return fail(ws, job, None, "protocol_error", e.render(), actor=actor)
    try:
        spec = registrable(ws, job)
    except FlowError as e:
        return fail(ws, job, frame, "protocol_error", e.render(), actor=actor)
    if specs is not None:
        specs[job.key] = spec
    if spec.after:
        return _register_after(ws, job, frame, spec, actor)
    if spec.hold:
        # `flow submit --hold`: registered, but nothing runs until `flow release`
        return transition(ws, job, State.PAUSED, frame.body.carry(why="held"), actor=actor)
    return transition(ws, job, State.READY, frame.body.carry(), actor=actor)


def _register_after(
    ws: Workspace, job: JobHandle, frame: Frame, spec: JobSpec, actor: str
) -> JobHandle:
    """A dependent goes where its sets send it, decided before the one rename: whoever
    decides a set later finds it waiting, or registers it itself (protocol.md §14). A held
    one is paused, keeping `.a` while its sets are open."""
    v = verdict(ws, spec.after)
    if v.kind == "cancel":
        body = frame.body.carry(why="dependency not met", reason=v.reason)
        return transition(ws, job, State.CANCELLED, body, actor=actor)
    if v.kind == "fail":
        return fail(ws, job, frame, "dependency_failure", v.reason, actor=actor)
    waits = v.kind == "wait"
    if spec.hold:
        body = frame.body.carry(why="held")
        return transition(ws, job, State.PAUSED, body, actor=actor, after=waits)
    if not waits:
        return transition(ws, job, State.READY, frame.body.carry(why=v.reason), actor=actor)
    body = frame.body.carry(why="after")
    return transition(ws, job, State.WAITING, body, actor=actor, after=True)


def registrable(ws: Workspace, job: JobHandle) -> JobSpec:
    """The definition registration accepts; FlowError says why it would fail the job."""
    spec = load_spec(ws, job.placement, job.key)
    gone = programs.missing(ws, spec.program)
    if gone is not None:
        raise InvalidJob(gone, obj=job.key)
    return spec


def fail(
    ws: Workspace,
    job: JobHandle,
    frame: Frame | Body | None,
    code: str,
    message: str,
    *,
    actor: str,
    retryable: bool = False,
) -> JobHandle:
    """Move a job to failed with a failure record (code, message, retryable); `frame` is
    the job's current frame or body (None: it could not be read; no snapshot is kept)."""
    failure = Failure(code, message[:4000], retryable)
    body = frame.body if isinstance(frame, Frame) else frame or Body()
    return transition(ws, job, State.FAILED, body.carry(failure=failure), actor=actor)


def all_jobs(ws: Workspace, states: tuple[State, ...] = tuple(State)) -> Iterator[JobHandle]:
    for st in states:
        yield from walk_all(ws, st)
