"""This manager's own attempts: launch behind the gate, reap, commit, and stop on demand."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Callable

from httk_flow.errors import FlowError, TransitionConflict, UnsafePath
from httk_flow.manager.attempts import prepare
from httk_flow.manager.commit import Committer, is_transient
from httk_flow.manager.exec_failure import exec_failure
from httk_flow.manager.launcher import (
    group_alive,
    launch,
    read_exec_failure,
    signal_group,
)
from httk_flow.manager.log import ManagerLog
from httk_flow.manager.running import (
    KILL_SETTLE,
    PENDING_DELAY_CAP,
    PENDING_PERMANENT_TRIES,
    Finished,
    LocalAttempt,
    Pending,
)
from httk_flow.manager.slots import Binding, Slots
from httk_flow.manager.tidy import Tidy
from httk_flow.protocol.crash import crash_point
from httk_flow.protocol.frames import Body, Evidence
from httk_flow.protocol.jobs import fail
from httk_flow.protocol.jobspec import JobSpec, duration_words
from httk_flow.protocol.last import Last
from httk_flow.protocol.programs import InPlaceCheck
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle, locate_key, transition
from httk_flow.protocol.workspace import Workspace

#: seconds between two looks at the running markers of our attempts (check_fenced)
FENCE_LOOK = 0.1


class LocalAttempts:
    def __init__(
        self,
        ws: Workspace,
        actor: str,
        log: ManagerLog,
        committer: Committer,
        *,
        kill_grace: float,
        clock: Callable[[], float] = time.time,
        on_start: Callable[[LocalAttempt], None] | None = None,
        slots: Slots | None = None,
    ) -> None:
        self.ws = ws
        self.actor = actor
        self.log = log
        self.committer = committer
        self.kill_grace = kill_grace
        self.clock = clock
        self.on_start = on_start
        #: the inventory attempts' bindings come from and go back to
        self.slots = slots
        self.by_key: dict[str, LocalAttempt] = {}
        #: process groups of ended attempts that still had members: pgid -> KILL time
        self.leftovers: dict[int, float] = {}
        #: commits and releases waiting out a transient error, by job key
        self.pending: dict[str, Pending] = {}
        #: the digests of in-place programs, checked before each of their launches
        self.in_place = InPlaceCheck()
        #: jobs failed before their attempt could start, reported by the next reap
        self._refused: list[Finished] = []
        self._fence_looked = -1e18

    def __len__(self) -> int:
        # a commit still to be retried holds its slot: nothing is done until it lands
        return len(self.by_key) + len(self.pending)

    def start(
        self,
        claimed: JobHandle,
        spec: JobSpec,
        claim_body: Body,
        extra_context: dict[str, object] | None = None,
        binding: Binding | None = None,
    ) -> JobHandle | None:
        """claimed -> running behind a closed gate; opens the gate once the marker says so.

        `binding`: the resources the claim pass took for it; given back however this ends."""
        got = self._start(claimed, spec, claim_body, extra_context, binding)
        if got is None and binding is not None and self.slots is not None:
            self.slots.give(binding)
        return got

    def _start(
        self,
        claimed: JobHandle,
        spec: JobSpec,
        claim_body: Body,
        extra_context: dict[str, object] | None,
        binding: Binding | None,
    ) -> JobHandle | None:
        if spec.program.in_place:
            changed = self.in_place.changed(spec.program)
            if changed is not None:
                self._refuse(claimed, spec, claim_body, "program_changed", changed)
                return None
        number = claim_body.snap.tries
        try:
            plan = prepare(
                self.ws,
                spec,
                claim_body.snap,
                number=number,
                extra_context=extra_context,
            )
            if binding is not None and self.slots is not None:
                plan.env.update(binding.env(bool(self.slots.inventory.gpus), plan.env))
            proc = launch(
                plan.argv,
                cwd=plan.workdir,
                env=plan.env,
                stdout=plan.stdout,
                stderr=plan.stderr,
                exec_failure=plan.exec_failure,
                context=plan.context,
                bash=plan.bash,
            )
        except ValueError as e:
            # what the job hands to its environment or argv cannot be passed (a NUL byte in
            # a parameter): that job fails, the manager goes on
            msg = f"cannot start the attempt ({e})"
            self.log.problem(claimed.key, msg)
            with contextlib.suppress(FlowError):
                fail(self.ws, claimed, claim_body, "launch_error", msg, actor=self.actor)
            return None
        except OSError as e:
            msg = f"cannot start the attempt ({e.strerror}: {e.filename or ''})"
            self.log.problem(claimed.key, msg)
            if is_transient(e):
                # a full disk fails no job: the claim goes back and is tried again later
                self._hold(Pending(None, claimed, spec, claim_body, None))
                return None
            try:
                fail(self.ws, claimed, claim_body, "launch_error", msg, actor=self.actor)
            except TransitionConflict:
                pass
            except FlowError as e2:
                self.log.problem(claimed.key, f"cannot fail the job: {e2.render()}")
                self._hold(Pending(None, claimed, spec, claim_body, None))
            return None
        crash_point("launch.after_spawn")
        if binding is not None and self.slots is not None:
            # behind the gate: pinned, and its devices named as its group's, before it runs
            self.slots.attach(binding, proc.pid)
        assert claim_body.attempt is not None  # a claim names its attempt
        # the limit comes from the journal (how many attempts of this activation reached
        # theirs), never from memory: a manager that takes the job over computes the same
        limit = spec.time_limit_after(claim_body.snap.timeouts)
        attempt = claim_body.attempt.launched(
            pid=proc.pid, start_time=proc.start_time, dir=plan.dir, limit=limit
        )
        body = claim_body.carry(attempt=attempt)
        try:
            running = transition(
                self.ws, claimed, State.RUNNING, body, actor=self.actor, note=plan.name
            )
        except FlowError as e:
            proc.close_gate()  # the gate closes unopened: the program never runs
            proc.wait()
            proc.close()
            self.log.problem(claimed.key, f"lost the job before launch: {e.render()}")
            if isinstance(e, UnsafePath):
                # the job cannot live where it is: fail it rather than hold it claimed
                with contextlib.suppress(FlowError):
                    fail(self.ws, claimed, claim_body, "unsafe_path", e.render(), actor=self.actor)
            return None
        crash_point("launch.after_running")
        proc.open_gate()
        la = LocalAttempt(
            running,
            spec,
            body,
            plan,
            proc,
            self.clock(),
            opened=time.monotonic(),
            limit=limit,
            binding=binding,
        )
        self.by_key[running.key] = la
        if self.on_start:
            self.on_start(la)
        return running

    def _refuse(
        self, claimed: JobHandle, spec: JobSpec, claim_body: Body, code: str, message: str
    ) -> None:
        """Fail a claimed job whose program must not run: no retry, no backoff (as for
        program_not_found), and counted by the next reap like any failed attempt."""
        self.log.problem(claimed.key, message)
        body = claim_body.carry(snap=claim_body.snap.but(last=Last.failed(code)))
        try:
            failed = fail(self.ws, claimed, body, code, message, actor=self.actor)
        except TransitionConflict:
            return
        except FlowError as e:
            self.log.problem(claimed.key, f"cannot fail the job: {e.render()}")
            self._hold(Pending(None, claimed, spec, claim_body, None))
            return
        self._refused.append(Finished(spec, failed))

    def reap(self) -> list[Finished]:
        """Commit every attempt whose process has exited."""
        if self.leftovers:
            self._kill_leftovers(self.clock())
        done = self._retry_pending() if self.pending else []
        if self._refused:
            done += self._refused
            self._refused = []
        mono = time.monotonic()
        for key, la in list(self.by_key.items()):
            rc = la.proc.poll()
            if rc is None:
                if la.term_at is not None:
                    if self.clock() - la.term_at > self.kill_grace:
                        la.proc.signal_group(signal.SIGKILL)
                elif la.limit is not None and mono - la.opened >= la.limit:
                    self._time_limit(la)
                continue
            del self.by_key[key]
            la.proc.close()
            if la.binding is not None and self.slots is not None:
                self.slots.give(la.binding)
            done.append(Finished(la.spec, self._settle(la, rc)))
        return done

    def _time_limit(self, la: LocalAttempt) -> None:
        """TERM the group of an attempt that reached its limit (KILL follows after the
        grace, as for a drain); its ending is a charged failure."""
        assert la.limit is not None
        la.term_at = self.clock()
        la.timed_out = True
        la.proc.signal_group(signal.SIGTERM)
        self.log.info(
            f"{la.job.key}: time limit {duration_words(la.limit)} reached; "
            "its process group was sent TERM",
            job=la.job.key,
            pgid=la.proc.pid,
        )

    def next_deadline(self) -> float | None:
        """Seconds until the earliest time limit of a running attempt (None: no limit),
        for a loop that wants to wake exactly then rather than at its next poll."""
        mono = time.monotonic()
        left = [
            la.opened + la.limit - mono
            for la in self.by_key.values()
            if la.limit is not None and la.term_at is None
        ]
        return max(0.0, min(left)) if left else None

    def _settle(self, la: LocalAttempt, rc: int) -> JobHandle | None:
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
            return self._fenced(la, code, sig)
        except (FlowError, OSError) as e:
            msg = e.render() if isinstance(e, FlowError) else str(e)
            self.log.problem(la.job.key, f"commit failed: {msg}; retrying while it fails")
            if not isinstance(e, UnsafePath):
                self._hold(Pending(la, la.job, la.spec, la.body, ending, code, sig))
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

    def _hold(self, p: Pending) -> None:
        p.next_at = self.clock() + p.delay
        self.pending[p.claimed.key] = p

    def _retry_pending(self) -> list[Finished]:
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
                handle = (
                    self._fenced(p.la, p.code, p.sig, reaped=True) if p.la is not None else None
                )
            except (FlowError, OSError) as e:
                if is_transient(e) or p.tries < PENDING_PERMANENT_TRIES:
                    p.delay = min(PENDING_DELAY_CAP, p.delay * 2)
                    self._hold(p)  # reported once, when it first failed
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
                body = p.body.carry(
                    snap=p.body.snap.but(try_=max(0, p.body.snap.try_ - 1)),
                    why="released: the attempt could not start",
                )
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

    def _fenced(
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

    def check_fenced(self) -> None:
        """Stop attempts whose running marker was moved away: a cancel fenced them, or
        another manager took the job over while we were frozen or cut off (its outcome
        would be ignored: the work is wasted, and may get in the new attempt's way).

        At most every FENCE_LOOK seconds: a tick comes at every exit, and a commit checks
        its marker by its own rename anyway; this only stops wasted work sooner."""
        mono = time.monotonic()
        if mono - self._fence_looked < FENCE_LOOK:
            return
        self._fence_looked = mono
        for key, la in list(self.by_key.items()):
            if la.term_at is not None or os.path.lexists(la.job.path(self.ws)):
                continue
            now = locate_key(self.ws, la.job.placement, key)
            if now is None or now.marker == la.job.marker:
                continue  # moving or vanished: look again next tick
            if now.state is State.CANCELLING:
                self.stop(key, interrupted=False)
            else:
                self.log.problem(
                    key, f"taken over while it ran here (now {now.state.value}); stopped"
                )
                self.stop(key, interrupted=True)

    def stop(self, key: str, *, interrupted: bool) -> bool:
        """TERM an attempt's process group (KILL follows after the grace in reap)."""
        la = self.by_key.get(key)
        if la is None:
            return False
        if la.term_at is None:
            la.term_at = self.clock()
            la.interrupted = interrupted
            la.proc.signal_group(signal.SIGTERM)
            crash_point("cancel.after_signal")
        return True

    def stop_all(self, *, interrupted: bool) -> None:
        for key in list(self.by_key):
            self.stop(key, interrupted=interrupted)

    def kill_all(self) -> None:
        for la in self.by_key.values():
            la.proc.signal_group(signal.SIGKILL)
        self._kill_leftovers(None)

    def _kill_leftovers(self, now: float | None) -> None:
        """KILL the groups of ended attempts whose grace is over (all of them if now=None)."""
        for pgid, at in list(self.leftovers.items()):
            if not signal_group(pgid, 0):
                del self.leftovers[pgid]  # every member is gone (TERM was enough)
            elif now is None or now >= at:
                del self.leftovers[pgid]
                # the group is leaderless: its id is not reused while a member lives
                if group_alive(pgid):
                    signal_group(pgid, signal.SIGKILL)

    def pidfds(self) -> list[int]:
        return [la.proc.pidfd for la in self.by_key.values() if la.proc.pidfd >= 0]
