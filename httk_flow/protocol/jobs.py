"""Reading a job back: its definition, frames and attempt directories; registration;
failing a job."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

from httk_flow.errors import FlowError, InvalidJob
from httk_flow.protocol import layout, programs
from httk_flow.protocol.after import verdict
from httk_flow.protocol.discovery import walk_all
from httk_flow.protocol.frames import Body, Failure, Frame
from httk_flow.protocol.fsio import fs
from httk_flow.protocol.jobspec import MAX_JOB_JSON, JobSpec
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle, Move, transition, transition_many
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
    move = _plain(job, frame, spec)
    return transition(ws, job, move.target, move.body, actor=actor)


#: registrations whose frames one append carries (register_many)
REGISTER_BATCH = 256


def register_many(
    ws: Workspace,
    jobs: Sequence[JobHandle],
    *,
    actor: str,
    specs: dict[str, JobSpec] | None = None,
) -> list[JobHandle | FlowError]:
    """register() for each of `jobs`, in order: the new handle, or the error (a lost race
    is a TransitionConflict). Plain registrations (a valid definition, no dependencies)
    are moved REGISTER_BATCH at a time by transition_many: one append, in durable mode
    one fsync, for the batch; the others one by one, as register() does."""
    out: list[JobHandle | FlowError | None] = [None] * len(jobs)
    plain: list[tuple[int, Move]] = []
    present: set[str] = set()  # stores seen to hold a program in this call
    for i, job in enumerate(jobs):
        try:
            try:
                frame = current_frame(ws, job)
                spec = registrable(ws, job, present)
            except FlowError:
                out[i] = register(ws, job, actor=actor, specs=specs)  # fails it, saying why
                continue
            if specs is not None:
                specs[job.key] = spec
            if spec.after:
                out[i] = _register_after(ws, job, frame, spec, actor)
            else:
                plain.append((i, _plain(job, frame, spec)))
        except FlowError as e:
            out[i] = e
        if len(plain) >= REGISTER_BATCH:
            _move_plain(ws, plain, out, actor)  # a batch at a time: memory stays bounded
            plain = []
    if plain:
        _move_plain(ws, plain, out, actor)
    return [r for r in out if r is not None]


def _move_plain(
    ws: Workspace,
    plain: list[tuple[int, Move]],
    out: list[JobHandle | FlowError | None],
    actor: str,
) -> None:
    try:
        moved = transition_many(ws, [m for _, m in plain], actor=actor)
    except FlowError as e:  # the append failed (a full disk, say): none of them moved
        moved = [e] * len(plain)
    for (i, _), r in zip(plain, moved, strict=True):
        out[i] = r


def _plain(job: JobHandle, frame: Frame, spec: JobSpec) -> Move:
    """Where a job with no dependencies goes: `flow submit --hold` keeps it paused (nothing
    runs until `flow release`), else it is ready."""
    if spec.hold:
        return Move(job, State.PAUSED, frame.body.carry(why="held"))
    return Move(job, State.READY, frame.body.carry())


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


def registrable(ws: Workspace, job: JobHandle, present: set[str] | None = None) -> JobSpec:
    """The definition registration accepts; FlowError says why it would fail the job.
    `present`: store entries already seen to exist (programs.missing)."""
    spec = load_spec(ws, job.placement, job.key)
    gone = programs.missing(ws, spec.program, present)
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
