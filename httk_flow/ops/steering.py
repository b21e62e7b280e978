"""Operator steering: cancel, pause, resume and priority, done by one rename where possible.

A job with no live attempt is steered directly by whoever asks (the CLI included). A
running job is fenced by renaming it to cancelling; its owner stops the process group
and records the verified exit, or, when the owner is dead, the manager that recovers the
job does (the note says which, and when). A pause of a running job waits for the attempt
to end.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from httk_flow.errors import FlowError, TransitionConflict, UsageError
from httk_flow.ops.managers import START_ONE, clock, lease_wait
from httk_flow.protocol import names, requests
from httk_flow.protocol.children import child_placement
from httk_flow.protocol.crash import crash_point
from httk_flow.protocol.discovery import markers_of_placement
from httk_flow.protocol.durations import compact_duration
from httk_flow.protocol.frames import AttemptRecord, Body, Last, LastKind
from httk_flow.protocol.jobs import fail, registrable
from httk_flow.protocol.leases import Liveness, read_managers
from httk_flow.protocol.procs import group_alive
from httk_flow.protocol.release import resume_target, settle_with_retry
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle, locate_key, transition
from httk_flow.protocol.workspace import Workspace


@dataclass(frozen=True)
class SteerResult:
    key: str
    before: State
    after: State
    note: str = ""
    #: nothing was asked of this job (`flow release` of one that is not paused)
    skipped: bool = False


def _actor() -> str:
    return f"cli-{os.getpid()}"


def _retry_locate(ws: Workspace, job: JobHandle) -> JobHandle:
    now = locate_key(ws, job.placement, job.key)
    if now is None:
        raise FlowError("has no marker any more", obj=f"job {job.key}", hint="run `flow fsck`")
    return now


class Owners:
    """The managers' liveness, read once on first need, for one steering command."""

    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self._by_id: dict[str, Liveness] | None = None
        self.at = 0.0

    def _read(self) -> dict[str, Liveness]:
        if self._by_id is None:
            self._by_id = {lv.info.id: lv for lv in read_managers(self.ws)}
            self.at = time.time()
        return self._by_id

    def get(self, manager: str) -> Liveness | None:
        return self._read().get(manager)

    @property
    def live(self) -> list[Liveness]:
        return [lv for lv in self._read().values() if lv.alive]


def who_stops(ws: Workspace, att: AttemptRecord | None, owners: Owners) -> str:
    """What happens to a fenced job's attempt: its manager stops it, or, with that manager
    dead, the manager that recovers the job marks it cancelled (and when)."""
    lv = owners.get(att.manager) if att is not None and att.manager else None
    if att is None or (lv is not None and lv.alive):
        return "its manager stops the process group"
    host = lv.info.host if lv is not None else att.host
    if lv is None:
        note = (
            f"its manager {att.manager} left no heartbeat: the next manager marks it "
            "cancelled once it has missed that heartbeat for "
            f"{compact_duration(ws.policy.lease * ws.policy.takeover_factor)}"
        )
    elif lv.stopped:
        note = f"its manager {att.manager} has stopped: the next manager marks it cancelled at once"
    elif lv.process is not None:
        # it ran here and its process is gone: the next manager here has its evidence
        if att.pgid is not None and group_alive(att.pgid):
            note = (
                f"its manager {att.manager} is dead and its process group {att.pgid} still "
                "runs on this host: the next manager here kills it (KILL) and marks the job "
                "cancelled"
            )
        else:
            note = (
                f"its manager {att.manager} is dead and its process is gone: the next "
                "manager here marks it cancelled at once"
            )
    else:
        now = owners.at
        w = lease_wait(lv, ws.policy.takeover_factor, now, owners.live)
        dead = f"its manager {att.manager} on {host} is dead"
        watch = f"it has watched that heartbeat for {compact_duration(w.lease)}"
        if w.expires is None:
            when = (
                f"once a running manager has seen its heartbeat unchanged for "
                f"{compact_duration(w.grace)}"
            )
        elif w.watched is not None and w.watched > now:
            when = (
                f"once its lease expires in ~{compact_duration(w.watched - now)} "
                f"(at {clock(w.watched, now)})"
            )
        elif w.watched is not None:
            dead += f" (its lease expired at {clock(w.expires, now)})"
            when = "at its next look"
        elif w.expires > now:
            when = (
                f"once its lease expires in ~{compact_duration(w.expires - now)} "
                f"(at {clock(w.expires, now)}) and {watch}"
            )
        else:
            dead += f" (its lease expired at {clock(w.expires, now)})"
            when = f"once {watch}"
        note = (
            f"{dead}: the next manager marks it cancelled {when}; only a manager on {host} "
            "stops its process there"
        )
    if not owners.live:
        note += f"; no manager is running: {START_ONE}"
    return note


def cancel(
    ws: Workspace, job: JobHandle, reason: str = "", owners: Owners | None = None
) -> SteerResult:
    """Cancel a job and, depth first, every child it spawned that is not finished."""
    owners = owners or Owners(ws)
    result = _cancel_one(ws, job, reason, owners)
    n = 0
    for child in children_of(ws, job):
        if not child.state.is_permanent:
            try:
                cancel(ws, child, reason or f"parent {job.key} cancelled", owners)
                n += 1
            except FlowError:
                pass  # a child that keeps moving is reported by its own next cancel
    if n:
        note = f"{result.note}; " if result.note else ""
        return SteerResult(result.key, result.before, result.after, f"{note}{n} children too")
    return result


def children_of(ws: Workspace, job: JobHandle) -> list[JobHandle]:
    """The job's children, from one listing per state kind of their placement."""
    placement = child_placement(job.placement, job.key)
    return [JobHandle(st, placement, m) for st, m in markers_of_placement(ws, placement)]


def _cancel_one(ws: Workspace, job: JobHandle, reason: str, owners: Owners) -> SteerResult:
    """One job: one rename if nothing runs, else fence it for its owner to stop."""
    for _ in range(5):
        st = job.state
        if st in (State.SUCCEEDED, State.CANCELLED, State.CANCELLING):
            return SteerResult(job.key, st, st, f"already {st.value}")
        was = ws.reader.frame(job.marker.ref).body
        try:
            if st is State.RUNNING:
                body = was.carry(attempt=was.attempt, why="cancel requested", reason=reason)
                new = transition(ws, job, State.CANCELLING, body, actor=_actor())
                crash_point("cancel.after_fence")
                note = who_stops(ws, was.attempt, owners)
                return SteerResult(job.key, st, new.state, note)
            if st is State.COMMITTING:
                time.sleep(0.2)  # a commit takes milliseconds; look again
                job = _retry_locate(ws, job)
                continue
            body = was.carry(why="cancelled", reason=reason)
            new = transition(ws, job, State.CANCELLED, body, actor=_actor())
            return SteerResult(job.key, st, new.state)
        except TransitionConflict:
            job = _retry_locate(ws, job)
    raise FlowError(
        "kept changing state while being cancelled",
        obj=f"job {job.key}",
        hint="run the command again",
    )


def pause(ws: Workspace, job: JobHandle) -> SteerResult:
    for _ in range(5):
        st = job.state
        was = ws.reader.frame(job.marker.ref).body
        try:
            if st in (State.READY, State.WAITING):
                new = transition(
                    ws, job, State.PAUSED, was.carry(join=was.join, why="paused"), actor=_actor()
                )
                return SteerResult(job.key, st, new.state)
            if st in (State.CLAIMED, State.RUNNING, State.COMMITTING):
                requests.make(ws, job, "pause")
                return SteerResult(job.key, st, st, "pauses when its current attempt ends")
            if st is State.SUBMITTED:
                return _pause_submitted(ws, job, was)
            return SteerResult(job.key, st, st, f"cannot pause a {st.value} job")
        except TransitionConflict:
            job = _retry_locate(ws, job)
    raise FlowError("kept changing state while being paused", obj=f"job {job.key}")


def _pause_submitted(ws: Workspace, job: JobHandle, was: Body) -> SteerResult:
    """submitted -> paused, only for a definition registration would accept: resume
    goes straight to ready, so an invalid one is left for registration to fail."""
    try:
        spec = registrable(ws, job)
    except FlowError as e:
        raise UsageError(
            f"is left for registration, which fails it: {e.render()}", obj=f"job {job.key}"
        ) from None
    # a dependent keeps its dependencies: `.a` until its sets say otherwise (its
    # releaser settles it while paused, its resume decides from its sets)
    body = was.carry(why="paused")
    new = transition(ws, job, State.PAUSED, body, actor=_actor(), after=bool(spec.after))
    if spec.after:
        new = settle_with_retry(ws, new, actor=_actor())[0] or new
    return SteerResult(job.key, job.state, new.state)


def release(ws: Workspace, job: JobHandle) -> SteerResult:
    """Resume a held (paused) job; any other is skipped, not refused."""
    if job.state is not State.PAUSED:
        return SteerResult(job.key, job.state, job.state, "skipped: not paused", skipped=True)
    return resume(ws, job)


def resume(ws: Workspace, job: JobHandle, step: str | None = None) -> SteerResult:
    """Continue a paused or failed job (optionally at another step) as a new activation."""
    st = job.state
    if st not in (State.PAUSED, State.FAILED):
        raise UsageError(
            f"is {st.value}; only paused or failed jobs can be resumed", obj=f"job {job.key}"
        )
    if step is not None:
        names.check_ident(step, "step name")
    was = ws.reader.frame(job.marker.ref).body
    # an operator looked: a fresh budget. The counts of interruptions, manager deaths,
    # charged failures (max_attempts) and time limits reached start again
    looked = was.snap.but(intr=0, deaths=0, charged=0, timeouts=0)
    if st is State.PAUSED and was.join is not None and step is None:
        # a paused join goes back to waiting for its children
        body = was.carry(snap=looked, join=was.join, why="resumed")
        new = transition(ws, job, State.WAITING, body, actor=_actor())
        return SteerResult(job.key, st, new.state)
    snap = looked.but(try_=0, last=Last.of(LastKind.RESUMED))
    if step is not None or st is State.FAILED:
        snap = snap.but(act=snap.act + 1)
    if step is not None:
        snap = snap.but(step=step, join_ref=None)
    if st is State.PAUSED and job.marker.after:
        return _resume_dependent(ws, job, was.carry(snap=snap, why="resumed"))
    new = transition(ws, job, State.READY, was.carry(snap=snap, why="resumed"), actor=_actor())
    # a pause request still pending names a generation before the pause or failure, so
    # the next manager to look retires it rather than pausing this new activation
    return SteerResult(job.key, st, new.state)


def _resume_dependent(ws: Workspace, job: JobHandle, body: Body) -> SteerResult:
    """A paused job whose dependencies are not met yet (`.a`): ready once its sets are met,
    else back to waiting (and looked at again: a set decided between the check and that
    rename found it paused), or cancelled or failed as a broken set says (§14). A
    releaser that moved it first (dropping `.a`) is followed: it is then resumed as any."""
    first, actor = job.state, _actor()
    for _ in range(5):
        try:
            if not job.marker.after:
                new = transition(ws, job, State.READY, body, actor=actor)
                return SteerResult(job.key, first, new.state)
            decided = resume_target(ws, job)
            assert decided is not None  # `.a` was seen
            target, v = decided
            if target is State.FAILED:
                new = fail(ws, job, body, "dependency_failure", v.reason, actor=actor)
            elif target is State.CANCELLED:
                why = body.but(why="dependency not met", reason=v.reason)
                new = transition(ws, job, State.CANCELLED, why, actor=actor)
            elif target is State.WAITING:
                new = transition(ws, job, State.WAITING, body.but(why="after"), actor=actor)
                new = settle_with_retry(ws, new, actor=actor)[0] or new
            else:
                new = transition(ws, job, State.READY, body, actor=actor)
            return SteerResult(job.key, first, new.state)
        except TransitionConflict:
            job = _retry_locate(ws, job)
            if job.state is not State.PAUSED:
                return SteerResult(job.key, first, job.state, f"it is {job.state.value} now")
    raise FlowError("kept changing state while being resumed", obj=f"job {job.key}")


def set_priority(ws: Workspace, job: JobHandle, priority: int) -> SteerResult:
    """Set the job's priority now, or at the end of its current attempt if one is live."""
    names.check_priority(priority)
    for _ in range(5):
        st = job.state
        if st in (State.CLAIMED, State.RUNNING, State.COMMITTING):
            requests.make(ws, job, "priority", priority=priority)
            return SteerResult(
                job.key, st, st, f"priority {priority} when its current attempt ends"
            )
        if st not in (State.SUBMITTED, State.READY, State.WAITING, State.PAUSED):
            raise UsageError(
                f"is {st.value}; priority changes while a job is submitted, ready, waiting, "
                "paused or running",
                obj=f"job {job.key}",
            )
        was = ws.reader.frame(job.marker.ref).body
        body = was.carry(join=was.join, why=f"priority {priority}")
        try:
            new = transition(
                ws,
                job,
                st,
                body,
                actor=_actor(),
                priority=priority,
                not_before=job.marker.not_before,
            )
        except TransitionConflict:
            job = _retry_locate(ws, job)
            continue
        return SteerResult(job.key, st, new.state, f"priority {priority}")
    raise FlowError("kept changing state while its priority was set", obj=f"job {job.key}")
