"""This manager's own attempts: launch behind the gate, reap, commit, and stop on demand."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Callable

from httk_flow.errors import FlowError, TransitionConflict, UnsafePath
from httk_flow.manager.ahead import Gated, LaunchAhead
from httk_flow.manager.attempts import AttemptPlan, prepare
from httk_flow.manager.claim import Claimed, Sort
from httk_flow.manager.commit import Committer, is_transient
from httk_flow.manager.endings import Endings
from httk_flow.manager.launcher import LaunchedProcess, launch
from httk_flow.manager.log import ManagerLog
from httk_flow.manager.running import (
    Finished,
    LocalAttempt,
    Pending,
)
from httk_flow.manager.slots import Binding, Slots
from httk_flow.protocol.crash import crash_point
from httk_flow.protocol.frames import Body
from httk_flow.protocol.jobs import fail
from httk_flow.protocol.jobspec import JobSpec, duration_words
from httk_flow.protocol.last import Last
from httk_flow.protocol.programs import InPlaceCheck
from httk_flow.protocol.resources import DEFAULT_REQUEST
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle, locate_key, transition
from httk_flow.protocol.workspace import Workspace

#: seconds between two looks at the running markers of our attempts (check_fenced)
FENCE_LOOK = 0.1
#: why a spawn failed with E2BIG, in words a job's author can act on
TOO_BIG = (
    "its arguments and environment are larger than the kernel takes (at most 128 KiB for "
    "any one of them, about a quarter of the stack limit for all); pass large data in a file"
)
#: spawns failing in a row (each for another job, none started between) that stop the
#: claims: past a few, it is the node (a missing bash, a broken /bin/sh), not the jobs
SPAWN_FAILURES = 5


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
        ahead: LaunchAhead | None = None,
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
        #: jobs launched ahead, waiting at their gates for a worker (None: never done)
        self.ahead = ahead
        self.by_key: dict[str, LocalAttempt] = {}
        self.endings = Endings(ws, actor, log, committer, kill_grace=kill_grace, clock=clock)
        #: the endings' own: process groups left behind, and commits that wait
        self.leftovers = self.endings.leftovers
        self.pending = self.endings.pending
        #: the digests of in-place programs, checked before each of their launches
        self.in_place = InPlaceCheck()
        #: jobs failed before their attempt could start, reported by the next reap
        self._refused: list[Finished] = []
        #: spawns that failed in a row (no transient error, no start between), and why
        #: the last did (spawn_trouble)
        self.spawn_failures = 0
        self.spawn_failure = ""
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
        g = self._launch(claimed, spec, claim_body, extra_context, binding)
        got = self._go(g) if g is not None else None
        if got is None and binding is not None and self.slots is not None:
            self.slots.give(binding)
        return got

    def launch_ahead(self, c: Claimed, extra: dict[str, object] | None) -> None:
        """Launch a claimed job behind its gate to wait for a worker (ahead.py)."""
        assert self.ahead is not None and self.slots is not None
        g = self._launch(c.handle, c.spec, c.body, extra, self.slots.stand_in(), ahead=True)
        if g is not None:
            g.sort = c.sort
            self.ahead.gated.append(g)

    def start_ahead(self, free: int, best: Sort | None) -> int:
        """Open the gates of jobs launched ahead for up to `free` workers, while each is
        no worse than `best`, the candidate a claim would take instead (a continuation
        of ours, depth-first, or a higher priority). How many started."""
        if self.ahead is None:
            return 0
        started = 0
        while started < free and self.ahead.gated and self.slots is not None:
            if best is not None and best < self.ahead.gated[0].sort:
                break
            binding = self.slots.take(DEFAULT_REQUEST)
            if binding is None:
                break  # a CPU held by an attempt that outlived its manager: wait
            g = self.ahead.gated.pop(0)
            g.binding = binding
            if self._go(g) is None:
                self.slots.give(binding)
            else:
                started += 1
        return started

    def abandon(self, g: Gated, why: str) -> None:
        """Give back a job launched ahead whose program never ran (Gated.give_back)."""
        try:
            g.give_back(self.ws, self.actor, why)
        except FlowError as e:
            self.log.problem(g.claimed.key, f"cannot give the claim back: {e.render()}")
            self.endings.hold(Pending(None, g.claimed, g.spec, g.body, None))

    def abandon_stale(self) -> None:
        """Give back the jobs launched ahead that waited too long for a worker."""
        if self.ahead is not None and self.ahead.gated:
            for g in self.ahead.stale(time.monotonic()):
                self.abandon(g, "released: launched ahead, it waited too long for a worker")

    def abandon_all(self, why: str) -> None:
        if self.ahead is not None:
            for g in self.ahead.take_all():
                self.abandon(g, why)

    def _launch(
        self,
        claimed: JobHandle,
        spec: JobSpec,
        claim_body: Body,
        extra_context: dict[str, object] | None,
        binding: Binding | None,
        *,
        ahead: bool = False,
    ) -> Gated | None:
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
            proc = self._spawn(plan)
        except ValueError as e:
            # what the job hands to its environment or argv cannot be passed (a NUL byte in
            # a parameter): that job fails, the manager goes on
            self._refuse(
                claimed, spec, claim_body, "launch_error", f"cannot start the attempt ({e})"
            )
            return None
        except OSError as e:
            msg = f"cannot start the attempt ({e.strerror}: {e.filename or ''})"
            if e.errno == errno.E2BIG:
                msg = f"cannot start the attempt: {TOO_BIG}"
            if is_transient(e):
                # a full disk fails no job: the claim goes back and is tried again later
                self.log.problem(claimed.key, msg)
                self.endings.hold(Pending(None, claimed, spec, claim_body, None))
                return None
            self._refuse(claimed, spec, claim_body, "launch_error", msg)
            return None
        crash_point("launch.after_spawn")
        since = time.monotonic() if ahead else 0.0
        return Gated(claimed, spec, claim_body, plan, proc, None if ahead else binding, since)

    def _spawn(self, plan: AttemptPlan) -> LaunchedProcess:
        """launch() the plan, counting failures in a row: a spawn that fails for job after
        job says more about this node than about the jobs."""
        try:
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
        except OSError as e:
            if plan.bash and e.filename == plan.bash:
                # the path that failed is no file the job's author named: say where it came from
                e.filename = f"{e.filename}, the bash that the program's #! line names"
            if not is_transient(e) and e.errno != errno.E2BIG:  # E2BIG: the job's own
                self.spawn_failures += 1
                self.spawn_failure = f"{e.strerror}: {e.filename or ''}"
            raise
        self.spawn_failures = 0
        return proc

    def wait_leftovers(self) -> None:
        """Before exiting, give what ended attempts left behind its grace, then KILL it."""
        deadline = max(self.leftovers.values())
        while self.leftovers and self.clock() < deadline:
            self.reap()
            if self.leftovers:
                time.sleep(min(0.1, max(0.0, deadline - self.clock())))
        self.kill_all()

    def spawn_trouble(self) -> str | None:
        """Why this manager should claim no more, when its spawns keep failing."""
        if self.spawn_failures < SPAWN_FAILURES:
            return None
        return (
            f"{self.spawn_failures} spawns in a row failed, the last with "
            f"{self.spawn_failure}; no more claims here, so that this node fails no other "
            "job (once it is fixed, `flow resume` the jobs it failed: launch_error in "
            "`flow list --state failed`)"
        )

    def _go(self, g: Gated) -> JobHandle | None:
        """claimed -> running, then open the gate."""
        claimed, spec, claim_body, plan, proc = g.claimed, g.spec, g.body, g.plan, g.proc
        binding = g.binding
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
            g.close_unopened()
            if g.ahead and isinstance(e, TransitionConflict):
                # cancelled (or taken) while it waited for a worker, as a claimed job may be
                self.log.info(f"{claimed.key}: moved on while launched ahead; not started")
                return None
            self.log.problem(claimed.key, f"lost the job before launch: {e.render()}")
            if isinstance(e, UnsafePath):
                # the job cannot live where it is: fail it rather than hold it claimed
                with contextlib.suppress(FlowError):
                    fail(self.ws, claimed, claim_body, "unsafe_path", e.render(), actor=self.actor)
            return None
        crash_point("launch.after_running")
        # launched ahead, it learns its CPU only now: the gate's line names it
        proc.open_gate(",".join(map(str, binding.cpu_ids)) if g.ahead and binding else "")
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
        """Fail a claimed job whose program must not or cannot run: no retry, no backoff
        (as for program_not_found), and counted by the next reap like any failed attempt,
        so that it shows in the manager's summary, its exit status and its parent's join."""
        self.log.problem(claimed.key, message)
        body = claim_body.carry(snap=claim_body.snap.but(last=Last.failed(code)))
        try:
            failed = fail(self.ws, claimed, body, code, message, actor=self.actor)
        except TransitionConflict:
            return
        except FlowError as e:
            self.log.problem(claimed.key, f"cannot fail the job: {e.render()}")
            self.endings.hold(Pending(None, claimed, spec, claim_body, None))
            return
        self._refused.append(Finished(spec, failed))

    def reap(self) -> list[Finished]:
        """Commit every attempt whose process has exited."""
        if self.leftovers:
            self.endings.kill_leftovers(self.clock())
        done = self.endings.retry_pending() if self.pending else []
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
            done.append(Finished(la.spec, self._ended(la, rc)))
        return done

    def _ended(self, la: LocalAttempt, rc: int) -> JobHandle | None:
        elapsed = time.monotonic() - la.opened
        handle = self.endings.settle(la, rc)
        if self.ahead is not None:
            self.ahead.ended(elapsed, continues=handle is not None and handle.state is State.READY)
        return handle

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
        self.endings.kill_leftovers(None)

    def pidfds(self) -> list[int]:
        return [la.proc.pidfd for la in self.by_key.values() if la.proc.pidfd >= 0]
