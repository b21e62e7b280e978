"""How this manager's own attempts end: the commit of what each left, what it left
running in its group, and the commits (or claims to give back) that wait out an error."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Callable

from httk_flow.errors import FlowError, TransitionConflict, UnsafePath
from httk_flow.manager.commit import Committer, is_transient
from httk_flow.manager.exec_failure import exec_failure
from httk_flow.manager.launcher import group_alive, read_exec_failure, signal_group
from httk_flow.manager.log import ManagerLog
from httk_flow.manager.running import (
    KILL_SETTLE,
    PENDING_DELAY_CAP,
    PENDING_PERMANENT_TRIES,
    Finished,
    LocalAttempt,
    Pending,
)
from httk_flow.manager.tidy import Tidy
from httk_flow.protocol.frames import Evidence
from httk_flow.protocol.jobs import fail
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle, locate_key, transition
from httk_flow.protocol.workspace import Workspace


class Endings:
    """Commits the attempts that ended here and keeps what is still owed after them."""

    def __init__(
        self,
        ws: Workspace,
        actor: str,
        log: ManagerLog,
        committer: Committer,
        *,
        kill_grace: float,
        clock: Callable[[], float],
    ) -> None:
        self.ws = ws
        self.actor = actor
        self.log = log
        self.committer = committer
        self.kill_grace = kill_grace
        self.clock = clock
        #: commits and releases waiting out a transient error, by job key
        self.pending: dict[str, Pending] = {}
        #: process groups of ended attempts that still had members: pgid -> KILL time
        self.leftovers: dict[int, float] = {}

    def settle(self, la: LocalAttempt, rc: int) -> JobHandle | None:
        elapsed = time.monotonic() - la.opened
        code, sig = (rc, None) if rc >= 0 else (None, -rc)
        left = False
        if la.term_at is not None:
            # a stopped attempt may leave group members behind: make sure none survive
            signal_group(la.proc.pid, signal.SIGKILL)
        elif signal_group(la.proc.pid, signal.SIGTERM):
            left = True
            # like the end of a batch job step: what the program left running in its
            # group is stopped (TERM, KILL after the grace) rather than left to run on
            # in the allocation; a process meant to outlive the attempt needs setsid
            self.leftovers[la.proc.pid] = self.clock() + self.kill_grace
            self.log.info(
                f"{la.job.key}: processes left in the attempt's group were sent TERM",
                job=la.job.key,
                pgid=la.proc.pid,
            )
        ending = self.committer.ending_from_dir(
            la.plan.dir, code, sig, interrupted=la.interrupted, drained=la.interrupted
        )
        ending = dataclasses.replace(
            ending,
            elapsed=elapsed,
            time_limit=la.limit if la.timed_out else None,
            exec_failure=self._exec_failure(la, rc) if la.term_at is None else None,
        )
        try:
            return self.committer.commit(
                la.job, la.spec, la.body, ending, tidy=self._tidy(la, left)
            )
        except TransitionConflict:
            return self.fenced(la, code, sig)
        except (FlowError, OSError) as e:
            msg = e.render() if isinstance(e, FlowError) else str(e)
            self.log.problem(la.job.key, f"commit failed: {msg}; retrying while it fails")
            if not isinstance(e, UnsafePath):
                self.hold(Pending(la, la.job, la.spec, la.body, ending, code, sig))
                return None
            if isinstance(e, UnsafePath):
                # the commit may have reached committing before its target directory was
                # refused: fail the job from where its marker is now, or it stays
                # committing under a live owner that nobody takes over
                now = locate_key(self.ws, la.job.placement, la.job.key)
                if now is not None and now.state is State.COMMITTING:
                    with contextlib.suppress(FlowError):
                        frame = self.ws.reader.frame(now.marker.ref)
                        if frame.by != self.actor:
                            return None  # another manager finishes this commit now
                        return fail(
                            self.ws, now, frame, "unsafe_path", e.render(), actor=self.actor
                        )
            return None

    def _tidy(self, la: LocalAttempt, left: bool) -> Tidy | None:
        """What to remove of the attempt at its commit (None: the workspace keeps it all).
        What processes left in its group may still use (output, context, workdir) is
        kept, even empty: only its outcome goes."""
        if self.ws.policy.keep_attempt_files:
            return None
        return Tidy(
            self.ws.job_dir(la.job.placement, la.job.key),
            os.path.basename(la.plan.dir),
            persistent=la.spec.workdir == "persistent",
            settled=not left,
            job=la.spec.id,
            key=la.job.key,
            placement=la.job.placement,
        )

    def _exec_failure(self, la: LocalAttempt, rc: int) -> tuple[str, str] | None:
        """(code, message) when the launcher could not execute the program."""
        said = read_exec_failure(la.plan.exec_failure, rc)
        if said is None:
            return None
        return exec_failure(la.spec.program, la.plan.argv[0] if la.plan.argv else "?", *said)

    def hold(self, p: Pending) -> None:
        p.next_at = self.clock() + p.delay
        self.pending[p.claimed.key] = p

    def retry_pending(self) -> list[Finished]:
        """Try again the commits and releases whose backoff has passed."""
        now = self.clock()
        done = []
        for key, p in list(self.pending.items()):
            if p.next_at > now:
                continue
            del self.pending[key]
            p.tries += 1
            try:
                handle = self._retry(p)
            except TransitionConflict:
                handle = self.fenced(p.la, p.code, p.sig, reaped=True) if p.la is not None else None
            except (FlowError, OSError) as e:
                if is_transient(e) or p.tries < PENDING_PERMANENT_TRIES:
                    p.delay = min(PENDING_DELAY_CAP, p.delay * 2)
                    self.hold(p)  # reported once, when it first failed
                    continue
                msg = e.render() if isinstance(e, FlowError) else str(e)
                self.log.problem(key, f"gave up after {p.tries} tries: {msg}")
                handle = None
            else:
                self.log.info(f"{key}: done after {p.tries} retries", job=key)
            released = handle is not None and handle.state is State.READY
            if p.ending is not None or released:
                done.append(Finished(p.spec, handle))
        return done

    def _retry(self, p: Pending) -> JobHandle | None:
        """Finish what `p` holds from wherever its marker is now; never twice."""
        now = locate_key(self.ws, p.claimed.placement, p.claimed.key)
        if now is None:
            raise TransitionConflict("the job's marker is gone", obj=p.claimed.key)
        if now.marker == p.claimed.marker:
            if p.ending is None:
                body = p.body.released("released: the attempt could not start")
                return transition(self.ws, now, State.READY, body, actor=self.actor)
            return self.committer.commit(now, p.spec, p.body, p.ending)
        if now.state is State.COMMITTING and p.ending is not None:
            frame = self.ws.reader.frame(now.marker.ref)
            att, mine = frame.body.attempt, p.body.attempt
            ours = att is not None and mine is not None and att.n == mine.n
            if frame.by == self.actor and ours:
                # our own commit got as far as committing: finish what its frame records
                return self.committer.finish_recorded(now, frame.body)
        raise TransitionConflict("the job moved on while its commit waited", obj=p.claimed.key)

    def fenced(
        self, la: LocalAttempt, code: int | None, sig: int | None, *, reaped: bool = False
    ) -> JobHandle | None:
        """The marker moved under the attempt: finish a cancellation, else let it go.
        `reaped`: its group was stopped long ago (a retried commit); its id may be reused."""
        now = locate_key(self.ws, la.job.placement, la.job.key)
        if now is None or now.state is not State.CANCELLING:
            self.log.problem(la.job.key, "attempt was fenced; its outcome is ignored")
            return None
        was = self.ws.reader.frame(now.marker.ref).body
        att = was.attempt
        if att is None or att.manager != self.actor:
            return None
        gone = reaped
        if not reaped:
            signal_group(la.proc.pid, signal.SIGKILL)
            # a KILLed process is gone once the kernel has run it one last time: on a
            # busy node that takes a moment, which the evidence waits for (boundedly)
            deadline = time.monotonic() + KILL_SETTLE
            while not (gone := not group_alive(la.proc.pid)) and time.monotonic() < deadline:
                time.sleep(0.01)
        evidence = Evidence(
            exit=code, signal=sig, verified="reaped by its manager", group_gone=gone
        )
        body = was.carry(attempt=att, evidence=evidence, why="cancelled")
        try:
            done = transition(
                self.ws, now, State.CANCELLED, body, actor=self.actor, note="exit verified"
            )
        except TransitionConflict:
            return None
        return done

    def kill_leftovers(self, now: float | None) -> None:
        """KILL the groups of ended attempts whose grace is over (all of them if now=None)."""
        for pgid, at in list(self.leftovers.items()):
            if not signal_group(pgid, 0):
                del self.leftovers[pgid]  # every member is gone (TERM was enough)
            elif now is None or now >= at:
                del self.leftovers[pgid]
                # the group is leaderless: its id is not reused while a member lives
                if group_alive(pgid):
                    signal_group(pgid, signal.SIGKILL)
