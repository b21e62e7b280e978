"""Finding jobs by what a user types, and the views `flow show` and `flow list` print."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from httk_flow.errors import FlowError, JobNotFound
from httk_flow.protocol import names
from httk_flow.protocol.children import child_states
from httk_flow.protocol.discovery import markers_of_placement
from httk_flow.protocol.frames import AttemptRecord, Failure, Frame, Result
from httk_flow.protocol.groups import GroupRegistry
from httk_flow.protocol.jobs import all_jobs, history, load_spec
from httk_flow.protocol.jobspec import JobSpec, duration_words
from httk_flow.protocol.logstream import Streamed
from httk_flow.protocol.states import State, ends_commit
from httk_flow.protocol.transition import JobHandle
from httk_flow.protocol.workspace import Workspace


def find(ws: Workspace, ident: str) -> JobHandle:
    """A job by id, unique id prefix (8+ characters), key, or a tag naming exactly one job."""
    ident = ident.strip()
    matches = ident_matches(ws, ident)
    if len(matches) == 1:
        return matches[0]
    raise not_one(ws, ident, matches)


def ident_matches(ws: Workspace, ident: str, *, tags: bool = True) -> list[JobHandle]:
    """Every job `ident` names (id, 8+ hex prefix, key; with `tags`, a tag), one per key."""
    ident = ident.strip()
    # a job moving between two listings may be seen twice: one key, one job
    matches = list({h.key: h for h in _matches(ws, ident, tags)}.values())
    for pause in (0.01, 0.05):
        if matches:
            break
        # or not at all, when it moved into a state kind the walk had already listed:
        # a job that exists is found by a second look, one that does not costs two
        time.sleep(pause)
        matches = list({h.key: h for h in _matches(ws, ident, tags)}.values())
    return matches


def not_one(ws: Workspace, ident: str, matches: list[JobHandle], narrow: str = "") -> JobNotFound:
    """The error of a JOB that names no job or several; `narrow`: what else was asked
    (`--state failed`), said in the message."""
    where = f" with {narrow}" if narrow else ""
    if not matches:
        # filtered out, it did name jobs: the prefix note would mislead
        short_hex = not narrow and len(ident) < 8 and all(c in "0123456789abcdef" for c in ident)
        grouped = names.TAG_RE.fullmatch(ident) and GroupRegistry(ws).find(ident) is not None
        return JobNotFound(
            f"matches no job{where}"
            + (" (an id prefix needs at least 8 characters)" if short_hex else ""),
            obj=f"job {ident!r}",
            hint=f"it is a group: select its jobs with --group {ident}"
            if grouped
            else "see the jobs with `flow list`",
        )
    shown = ", ".join(m.key for m in matches[:5])
    tagged = all(m.marker.tag == ident for m in matches)
    return JobNotFound(
        f"matches {len(matches)} jobs{where} ({shown}{', ...' if len(matches) > 5 else ''})",
        obj=f"job {ident!r}",
        hint=f"select them all with --tag {ident}, narrow with --state/--group, or give the "
        "job's key"
        if tagged
        else "narrow with --state/--tag/--group, or give more of the id or the full key",
    )


def _matches(ws: Workspace, ident: str, tags: bool = True) -> Iterator[JobHandle]:
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
        yield from (
            h
            for h in all_jobs(ws)
            if h.job_id.startswith(ident) or (tags and h.marker.tag == ident)
        )
    elif m:
        yield from (h for h in all_jobs(ws) if h.key == ident or h.job_id == ident)
    elif names.TAG_RE.fullmatch(ident):
        if tags:
            yield from (h for h in all_jobs(ws) if h.marker.tag == ident)
    elif len(ident) < 8 and all(c in "0123456789abcdef" for c in ident):
        raise JobNotFound("an id prefix needs at least 8 characters", obj=f"job {ident!r}")


def _locate_in(ws: Workspace, st: State, placement: str, job_id: str) -> JobHandle | None:
    found = (m for _, m in markers_of_placement(ws, placement, (st,)) if m.job_id == job_id)
    mk = next(found, None)
    return None if mk is None else JobHandle(st, placement, mk)


@dataclass(frozen=True)
class JobView:
    """Everything `flow show` prints about one job."""

    handle: JobHandle
    spec: JobSpec | None
    spec_error: str | None
    frame: Frame | None  # None: the job's history cannot be read
    frames: list[Frame]

    @property
    def step(self) -> str | None:
        return self.frame.snap.step or None if self.frame is not None else None

    @property
    def activation(self) -> int | None:
        return self.frame.snap.act if self.frame is not None else None

    @property
    def failure(self) -> Failure | None:
        return self.frame.body.failure if self.frame is not None else None

    @property
    def message(self) -> str | None:
        """What the job said last (flow_succeed/fail/pause/advance/wait MESSAGE)."""
        for f in reversed(self.frames):
            if f.body.message:
                return f.body.message
            if f.body.result is not None and f.body.result.outcome is not None:
                said = f.body.result.outcome.get("message")
                if isinstance(said, str) and said:
                    return said
        return None

    @property
    def limit(self) -> float | None:
        """The time limit of the job's running attempt, else of its next, else (a job
        that ended) of its last; None: no limit."""
        if self.frame is None:
            return None
        return limit_of(self.handle.state, self.frame, lambda: self.spec)

    @property
    def elapsed(self) -> float | None:
        """How long the running attempt has run so far, else how long the last ran."""
        runs = self.attempts
        return runs[-1].elapsed_at(time.time()) if runs else None

    @property
    def attempts(self) -> list[AttemptView]:
        """One entry per attempt that was launched, oldest first, with how it ended."""
        out: dict[str, AttemptView] = {}
        for f in self.frames:
            att = f.body.attempt
            if att is None:
                continue
            seen = out.get(att.id)
            v = AttemptView(att, f.to, seen.started if seen else None, None, None)
            if f.to is State.RUNNING:
                v = dataclasses.replace(v, started=f.t)
            if f.body.result is not None:
                v = dataclasses.replace(v, result=f.body.result, ended=f.t)
            elif seen is not None:
                v = dataclasses.replace(v, result=seen.result, ended=seen.ended)
            logs = f.body.logs if f.body.logs is not None else seen.logs if seen else None
            if logs is not None:
                v = dataclasses.replace(v, logs=logs)
            out[att.id] = v
        return list(out.values())


@dataclass(frozen=True)
class AttemptView:
    """One attempt as `flow show` tells it: its record, where it went, how it ended."""

    record: AttemptRecord
    state: State
    started: float | None
    ended: float | None
    result: Result | None
    #: where its commit streamed its output (policy `logs: stream`): (stream, record)
    logs: Streamed | None = None

    @property
    def limit(self) -> float | None:
        """The time limit it ran under (None: none, or recorded by a version without)."""
        return self.record.limit

    def elapsed_at(self, now: float) -> float | None:
        """Seconds it ran: as its manager timed it, else between its frames; while it
        runs, until `now`."""
        if self.result is not None:
            if self.result.elapsed is not None:
                return self.result.elapsed
            if self.started is not None and self.ended is not None:
                return max(0.0, self.ended - self.started)
            return None
        if self.state is State.RUNNING and self.started is not None:
            return max(0.0, now - self.started)
        return None

    def to_json(self) -> dict[str, object]:
        a = self.record
        d: dict[str, object] = {"id": a.id, "n": a.n, "step": a.step, "manager": a.manager}
        d["host"] = a.host
        if a.pid is not None:
            d["pid"] = a.pid
        if a.dir is not None:
            d["dir"] = a.dir
        d["state"] = self.state.value
        if self.started is not None:
            d["started"] = self.started
        if self.result is not None:
            d["result"] = self.result.to_json()
            d["ended"] = self.ended
        d["limit"] = self.limit
        elapsed = self.elapsed_at(time.time())
        d["elapsed"] = round(elapsed, 3) if elapsed is not None else None
        return d

    @property
    def result_words(self) -> str:
        """How it ended in words: the outcome's action, else the exit status."""
        r = self.result
        if r is None:
            return "-"
        if r.outcome is not None:
            return r.outcome_words
        if r.outcome_error:
            return "bad outcome"
        if r.interrupted:
            return f"interrupted ({r.interrupted})"
        if r.time_limit is not None:
            return f"time limit {duration_words(r.time_limit)}"
        if r.signal:
            return f"signal {r.signal}"
        return f"exit {r.exit}"


def view(ws: Workspace, job: JobHandle) -> JobView:
    spec: JobSpec | None = None
    error = None
    try:
        spec = load_spec(ws, job.placement, job.key)
    except FlowError as e:
        error = e.render()
    frames = history(ws, job)
    return JobView(job, spec, error, frames[-1] if frames else None, frames)


def why_words(f: Frame) -> str:
    """Why a move happened, for `flow history`: the frame's reason, and how the attempt
    it commits ended when that is not the job's doing (a drain, a takeover, a limit)."""
    why = f.body.why or ""
    r, ev = f.body.result, f.body.evidence
    notes = []
    if r is not None and (State.COMMITTING in (f.source, f.to) or ends_commit(f.source, f.to)):
        if r.time_limit is not None:
            notes.append(f"time limit {duration_words(r.time_limit)}")
        elif r.interrupted == "drain":
            notes.append("drained by its manager")
        elif r.interrupted == "takeover":
            notes.append("its manager died")
    if ev is not None and ev.owner is not None and ev.verified is None:
        notes.append(f"taken over from {ev.owner}: {ev.evidence}")
    if f.body.reason:
        notes.append(f.body.reason)
    return "; ".join([why, *notes]) if notes else why


@dataclass(frozen=True)
class JoinProgress:
    """Where a waiting job's join stands: its children counted by state."""

    mode: str
    next: str
    children: int
    states: dict[str, int]  # state name (or "missing") -> children in it

    def words(self) -> str:
        order = [s.value for s in State] + ["missing"]
        parts = [f"{self.states[k]} {k}" for k in order if self.states.get(k)]
        return f"{self.children} children, {self.mode}: " + (", ".join(parts) or "none yet")

    def to_json(self) -> dict[str, object]:
        return {"mode": self.mode, "next": self.next, "children": self.children, **self.states}


def join_progress(ws: Workspace, v: JobView) -> JoinProgress | None:
    """The join of a waiting (or paused while waiting) job, its children looked up (one
    listing per state kind of their placement); None for a job that waits for nothing."""
    join = v.frame.body.join if v.frame is not None else None
    if join is None or v.handle.state not in (State.WAITING, State.PAUSED):
        return None
    kids = child_states(
        ws,
        v.handle.placement,
        v.handle.key,
        v.handle.job_id,
        join.act,
        [label for label, _ in join.children],
        dict(join.children),
    )
    states: dict[str, int] = {}
    for k in kids:
        name = k.state.value if k.state is not None else "missing"
        states[name] = states.get(name, 0) + 1
    return JoinProgress(join.mode, join.next, len(kids), states)


@dataclass(frozen=True)
class JobRow:
    """One line of `flow list`."""

    handle: JobHandle
    step: str
    attempts: int
    limit: float | None = None  # JobView.limit
    elapsed: float | None = None  # of the running attempt, else of the last one
    start: float | None = None  # when the running (else the last) attempt started
    end: float | None = None  # when the last attempt's commit ended it
    failure: Failure | None = None
    interrupted: str | None = None  # the last attempt was stopped: "drain" or "takeover"
    group: str | None = None  # the group's name, from the registry

    def to_json(self) -> dict[str, object]:
        h = self.handle
        return {
            "id": h.job_id,
            "key": h.key,
            "tag": h.marker.tag,
            "group": self.group,
            "state": h.state.value,
            "step": self.step,
            "priority": h.marker.priority,
            "attempts": self.attempts,
            "placement": h.placement,
            "limit": self.limit,
            "elapsed": round(self.elapsed, 3) if self.elapsed is not None else None,
            "start": self.start,
            "end": self.end,
            "failure": self.failure.to_json() if self.failure is not None else None,
            "interrupted": self.interrupted,
            # its dependencies (--after) are not all met yet: the marker says so
            "after": h.marker.after,
        }


#: states in which the frame a marker names records the attempt that ran last
_RAN = frozenset(
    {
        State.RUNNING,
        State.COMMITTING,
        State.CANCELLING,
        State.SUCCEEDED,
        State.FAILED,
        State.CANCELLED,
    }
)


def limit_of(state: State, frame: Frame, spec: Callable[[], JobSpec | None]) -> float | None:
    """The time limit of the job's running attempt, else of its next, else of its last.

    A running (or ended) attempt's own limit is in its frame; the next attempt's is the
    definition's, grown by the attempts of this activation that reached theirs, so only
    jobs between attempts need `spec` (job.json, read only then)."""
    att = frame.body.attempt
    if state in _RAN and att is not None and att.pid is not None:
        return att.limit
    if state in (State.SUCCEEDED, State.CANCELLED):
        return None  # never runs again
    s = spec()
    return s.time_limit_after(frame.snap.timeouts) if s is not None else None


def _elapsed_of(state: State, frame: Frame, now: float) -> float | None:
    """From the current frame alone: a running attempt's time so far (since its running
    frame), or the time the last attempt ran as its commit recorded it."""
    if state is State.RUNNING:
        return max(0.0, now - frame.t)
    r = frame.body.result
    return r.elapsed if r is not None else None


def list_rows(
    ws: Workspace,
    states: tuple[State, ...] = tuple(State),
    *,
    tag: str | None = None,
    limit: int | None = None,
    failed_code: str | None = None,
    interrupted: bool = False,
    jobs: Iterable[JobHandle] | None = None,
) -> Iterator[JobRow]:
    """Jobs in the given states (streamed; `jobs`: those, a selection's), each with its
    step and attempt count; only failed ones with `failed_code`, only those whose last
    attempt was stopped from outside (a drain, a takeover) with `interrupted`."""
    if failed_code is not None:
        states = tuple(st for st in states if st is State.FAILED)
    n = 0
    groups = GroupRegistry(ws)
    for h in all_jobs(ws, states) if jobs is None else jobs:
        if tag is not None and h.marker.tag != tag:
            continue
        if h.state not in states:
            continue
        d = h.marker.group_digest
        group = (groups.name_of(d) or f"?{d}") if d else None
        if limit is not None and n >= limit:
            return
        try:
            frame = ws.reader.frame(h.marker.ref)
        except FlowError:
            if failed_code is not None or interrupted:
                continue
            n += 1
            yield JobRow(h, "?", 0, group=group)
            continue
        snap, failure, result = frame.snap, frame.body.failure, frame.body.result
        if failed_code is not None and (failure is None or failure.code != failed_code):
            continue
        stopped = result.interrupted if result is not None else None
        if interrupted and stopped is None:
            continue
        elapsed = _elapsed_of(h.state, frame, time.time())
        start: float | None
        end: float | None
        if h.state is State.RUNNING:
            start, end = frame.t, None
        elif result is not None:
            end = frame.t
            start = end - result.elapsed if result.elapsed is not None else None
        else:
            start = end = None

        def spec(h: JobHandle = h) -> JobSpec | None:
            try:
                return load_spec(ws, h.placement, h.key)
            except FlowError:
                return None

        n += 1
        yield JobRow(
            h,
            snap.step or "?",
            snap.tries,
            limit_of(h.state, frame, spec),
            elapsed,
            start,
            end,
            failure if h.state is State.FAILED else None,
            stopped,
            group,
        )
