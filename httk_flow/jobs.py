"""Reading a job: its definition, its current frame, and finding it by what a user types."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from httk_flow import names
from httk_flow.discovery import walk_all
from httk_flow.errors import FlowError, InvalidJob, JobNotFound
from httk_flow.fsio import fs
from httk_flow.jobspec import MAX_JOB_JSON, JobSpec
from httk_flow.journal import Frame
from httk_flow.states import State
from httk_flow.transition import JobHandle, carry, transition
from httk_flow.workspace import Workspace


def load_spec(ws: Workspace, placement: str, key: str) -> JobSpec:
    """Parse a job's job.json; InvalidJob/UnsafePath name the file when it is bad."""
    path = os.path.join(ws.job_dir(placement, key), "job.json")
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
    return ws.reader.read(job.marker.ref)


def history(ws: Workspace, job: JobHandle) -> list[Frame]:
    """Every transition of the job, oldest first."""
    frames = list(ws.reader.chain(job.marker.ref))
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
        return fail(ws, job, {}, "protocol_error", e.render(), actor=actor)
    try:
        spec = load_spec(ws, job.placement, job.key)
        if spec.program.digest and not fs.exists(ws.program_path(spec.program.digest)):
            raise InvalidJob("names a program that is not in the program store", obj=job.key)
    except FlowError as e:
        return fail(ws, job, frame, "protocol_error", e.render(), actor=actor)
    if specs is not None:
        specs[job.key] = spec
    return transition(ws, job, State.READY, carry(frame), actor=actor)


def fail(
    ws: Workspace,
    job: JobHandle,
    frame: Frame,
    code: str,
    message: str,
    *,
    actor: str,
    retryable: bool = False,
) -> JobHandle:
    """Move a job to failed with a failure record (code, message, retryable)."""
    failure = {"code": code, "message": message[:4000], "retryable": retryable}
    return transition(ws, job, State.FAILED, carry(frame, failure=failure), actor=actor)


def all_jobs(ws: Workspace, states: tuple[State, ...] = tuple(State)) -> Iterator[JobHandle]:
    for st in states:
        yield from walk_all(ws, st)


def find(ws: Workspace, ident: str) -> JobHandle:
    """A job by id, unique id prefix (8+ characters), key, or a tag naming exactly one job."""
    ident = ident.strip()
    # a job moving between two listings may be seen twice: one key, one job
    matches = list({h.key: h for h in _matches(ws, ident)}.values())
    if len(matches) == 1:
        return matches[0]
    if not matches:
        short_hex = len(ident) < 8 and all(c in "0123456789abcdef" for c in ident)
        raise JobNotFound(
            "matches no job" + (" (an id prefix needs at least 8 characters)" if short_hex else ""),
            obj=f"job {ident!r}",
            hint="see the jobs with `flow list`",
        )
    shown = ", ".join(m.key for m in matches[:5])
    raise JobNotFound(
        f"matches {len(matches)} jobs ({shown}{', ...' if len(matches) > 5 else ''})",
        obj=f"job {ident!r}",
        hint="give more of the id, or the full key",
    )


def _matches(ws: Workspace, ident: str) -> Iterator[JobHandle]:
    m = names.KEY_RE.fullmatch(ident)
    if m:
        # default placements shard by id: look there first, then everywhere
        shard = names.default_placement(m.group("id"))
        found = [
            h
            for st in State
            if (h := _locate_in(ws, st, shard, m.group("id"))) is not None
            and (m.group("tag") is None or h.key == ident)
        ]
        if found:
            yield from found
            return
    if len(ident) >= 8 and all(c in "0123456789abcdef" for c in ident):
        # a tag may be all hex digits too (a date such as 20240611)
        yield from (h for h in all_jobs(ws) if h.job_id.startswith(ident) or h.marker.tag == ident)
    elif m:
        yield from (h for h in all_jobs(ws) if h.key == ident or h.job_id == ident)
    elif names.TAG_RE.fullmatch(ident):
        yield from (h for h in all_jobs(ws) if h.marker.tag == ident)
    elif len(ident) < 8 and all(c in "0123456789abcdef" for c in ident):
        raise JobNotFound("an id prefix needs at least 8 characters", obj=f"job {ident!r}")


def _locate_in(ws: Workspace, st: State, placement: str, job_id: str) -> JobHandle | None:
    try:
        entries = [e.name for e in fs.scandir(ws.state_dir(st, placement))]
    except OSError:
        return None
    for n in entries:
        if job_id in n:
            mk = names.Marker.parse_or_none(n)
            if mk is not None and mk.job_id == job_id:
                return JobHandle(st, placement, mk)
    return None


@dataclass(frozen=True)
class JobView:
    """Everything `flow show` prints about one job."""

    handle: JobHandle
    spec: JobSpec | None
    spec_error: str | None
    frame: Frame
    frames: list[Frame]

    @property
    def attempts(self) -> list[dict[str, object]]:
        """One entry per attempt that was launched, oldest first, with how it ended."""
        out: dict[str, dict[str, object]] = {}
        for f in self.frames:
            att = f.get("attempt")
            if isinstance(att, dict) and isinstance(att.get("id"), str):
                entry = out.setdefault(att["id"], {"id": att["id"]})
                for k in ("n", "step", "manager", "host", "pid", "dir"):
                    if k in att:
                        entry[k] = att[k]
                entry["state"] = f.get("to")
                if f.get("to") == State.RUNNING.value:
                    entry["started"] = f.get("t")
                if "result" in f:
                    entry["result"] = f["result"]
                    entry["ended"] = f.get("t")
        return list(out.values())


def view(ws: Workspace, job: JobHandle) -> JobView:
    spec: JobSpec | None = None
    error = None
    try:
        spec = load_spec(ws, job.placement, job.key)
    except FlowError as e:
        error = e.render()
    frames = history(ws, job)
    return JobView(job, spec, error, frames[-1] if frames else {}, frames)


@dataclass(frozen=True)
class JobRow:
    """One line of `flow list`."""

    handle: JobHandle
    step: str
    attempts: int

    def to_json(self) -> dict[str, object]:
        h = self.handle
        return {
            "id": h.job_id,
            "key": h.key,
            "tag": h.marker.tag,
            "state": h.state.value,
            "step": self.step,
            "priority": h.marker.priority,
            "attempts": self.attempts,
            "placement": h.placement,
        }


def list_rows(
    ws: Workspace,
    states: tuple[State, ...] = tuple(State),
    *,
    tag: str | None = None,
    limit: int | None = None,
) -> Iterator[JobRow]:
    """Jobs in the given states (streamed), each with its step and attempt count."""
    n = 0
    for h in all_jobs(ws, states):
        if tag is not None and h.marker.tag != tag:
            continue
        if limit is not None and n >= limit:
            return
        try:
            f = ws.reader.read(h.marker.ref)
            step, tries = str(f.get("step", "?")), int(f.get("tries", 0))
        except FlowError:
            step, tries = "?", 0
        n += 1
        yield JobRow(h, step, tries)
