"""The manager: one nonblocking tick of passes, a loop that wakes on child exits, and
orderly shutdown (drain.py: a first signal drains, a second one exits at once)."""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from httk_flow.errors import FlowError, UsageError
from httk_flow.manager.ahead import LaunchAhead
from httk_flow.manager.claim import ClaimPass
from httk_flow.manager.commit import Committer
from httk_flow.manager.config import ManagerConfig
from httk_flow.manager.dependencies import DependencyPass
from httk_flow.manager.drain import Drain
from httk_flow.manager.inbox import RequestInbox
from httk_flow.manager.inventory import detect
from httk_flow.manager.joins import JoinPass, join_context
from httk_flow.manager.launcher import proc_start_time
from httk_flow.manager.leftover import EXIT_WORK_LEFT, Leftover, ReadyLook, leftover, look_ready
from httk_flow.manager.local import LocalAttempts
from httk_flow.manager.log import ManagerLog, ProgressFeed, Reporter
from httk_flow.manager.owners import OwnerOracle
from httk_flow.manager.pace import IdlePace
from httk_flow.manager.passes import PassContext, RecoveryPass, RegisterPass
from httk_flow.manager.slots import Slots
from httk_flow.protocol import layout
from httk_flow.protocol.discovery import any_marker
from httk_flow.protocol.fsio import fs
from httk_flow.protocol.jobs import REGISTER_BATCH
from httk_flow.protocol.leases import (
    FsClock,
    ManagerInfo,
    heartbeat_path,
    mark_stopped,
    write_heartbeat,
)
from httk_flow.protocol.maintenance import read_lock
from httk_flow.protocol.names import to36
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle
from httk_flow.protocol.workspace import Workspace


@dataclass
class TickResult:
    actions: int
    started: int
    finished: int


class Manager:
    def __init__(
        self,
        ws: Workspace,
        config: ManagerConfig,
        *,
        clock: Callable[[], float] | None = None,
        reporter: Reporter | None = None,
    ) -> None:
        """`reporter`: a live display to feed (its lines and its progress), if any."""
        self.ws = ws
        self.config = config
        #: this host's clock: walltime ends and kill graces are measured in it
        self.clock = clock or time.time
        self.id = "m" + to36(secrets.randbits(48))
        self.lease = config.lease or ws.policy.lease
        self.log = ManagerLog(self.id, config.log_format, enabled=config.verbose, reporter=reporter)
        ws.on_transition.append(self.log.observe)  # one log line per transition, by itself
        self.feed = ProgressFeed(ws, self.id, config.workers, reporter) if reporter else None
        if self.feed is not None:
            ws.on_transition.append(self.feed.observe)
        self.started = self.clock()
        self._start_time = proc_start_time(os.getpid()) or 0
        self._last_beat = -1e18
        self._seq = 0
        self.pace = IdlePace(config.poll_interval, self.lease)
        #: why the last heartbeat could not be written (None: it was)
        self._beat_failed: str | None = None
        self.fs_clock = FsClock(ws)
        # not-before times are written into markers and compared by every manager: in the
        # shared filesystem's clock, unless a test brings its own
        shared: Callable[[], float] = self.fs_clock.now if clock is None else clock
        ends_at = config.ends_at
        if clock is None and ends_at is not None:
            ends_at -= self.fs_clock.skew  # the claim pass compares it with the shared clock
        self.failed_jobs = 0
        self.succeeded_jobs = 0
        self.attempts_started = 0
        #: what `flow run` left undone when it stopped for want of anything it could do
        self.left = Leftover()
        self._lock_checked = -1e18
        self._idle_marks = (0, 0, 0)
        #: the idle check's last look at the ready jobs (what an idle stop reports)
        self._looked: ReadyLook | None = None
        #: whether a directory's stat may miss another host's rename into it (NFS)
        self._stale_stats = fs.caches_attributes(ws.state_root)  # it may be a link elsewhere
        self._locked = False
        ctx = PassContext(ws, self.id, self.log, config.placements, self.heartbeat, shared)
        self.ctx = ctx
        self.inbox = RequestInbox(ws, self.id, self.log, lease_factor=ws.policy.takeover_factor)
        self.committer = Committer(ws, self.id, self.log, shared, self.inbox)
        self.committer.heartbeat = self.heartbeat
        self.oracle = OwnerOracle(
            ws,
            self.id,
            refresh=max(0.5, self.lease / 4),
            lease=self.lease,
            fs_clock=self.fs_clock,
            log=self.log,
        )
        inventory = config.inventory or detect(cpus=max(1, config.workers))
        self.slots = Slots(inventory, bind_cpus=config.bind_cpus)
        # a GPU's variables would have to be chosen at the launch (ahead.py)
        self.ahead = LaunchAhead(
            config.workers,
            enabled=config.launch_ahead and not inventory.gpus,
            depth_first=config.order == "depth",
        )
        self.local = LocalAttempts(
            ws,
            self.id,
            self.log,
            self.committer,
            kill_grace=config.kill_grace,
            clock=self.clock,
            slots=self.slots,
            ahead=self.ahead,
        )
        self.drain = Drain(self.log, self.local, self.heartbeat, config.drain_note)
        self.claim = ClaimPass(
            ctx,
            config.pools,
            config.capabilities,
            ends_at,
            config.order,
            slots=self.slots,
            reserve_after=config.reserve_after,
        )
        self.register = RegisterPass(ctx, self.claim.offer, on_failed=self._failed_here)
        # a join this manager releases is a continuation it keeps, as its own commits are
        self.joins = JoinPass(ctx, on_ready=self.claim.offer_own)
        self.dependencies = DependencyPass(ctx)
        self.recovery = RecoveryPass(
            ctx,
            self.oracle,
            self.committer,
            mine=lambda k: k in self.local.by_key,
            on_cancel_mine=self._cancel_local,
        )

    @property
    def draining(self) -> bool:
        """No new claims (drain.py)."""
        return self.drain.active

    @property
    def succeeded(self) -> int:
        """Jobs this manager committed succeeded: its attempts', and those it took over."""
        return self.succeeded_jobs + self.recovery.succeeded

    @property
    def failed(self) -> int:
        """Jobs it committed failed: attempts', takeovers', and failed at registration."""
        return self.failed_jobs + self.recovery.failed

    def _mine(self, job_id: str) -> bool:
        return any(k.endswith(job_id) for k in self.local.by_key)

    def _cancel_local(self, key: str) -> None:
        self.local.stop(key, interrupted=False)

    # -- lease -------------------------------------------------------------------

    def info(self) -> ManagerInfo:
        unfit, need = self.claim.unfit()
        return ManagerInfo(
            id=self.id,
            host=self.ws.host,
            pid=os.getpid(),
            started=self.started,
            pools=self.config.pools,
            capabilities=self.config.capabilities,
            placements=self.config.placements,
            workers=self.config.workers,
            running=len(self.local),
            draining=self.draining,
            ends_at=self.config.ends_at,
            lease=self.lease,
            start_time=self._start_time,
            allocation=os.environ.get(layout.ENV_ALLOCATION_TOKEN, ""),
            seq=self._seq,
            drain_at=self.config.drains_at,
            allocation_end=self.config.allocation_end,
            reserve=self.config.reserve,
            attempts=self.attempts_started,
            unfit=unfit,
            unfit_need=need,
            inventory=self.slots.inventory.offer,
            in_use=self.slots.in_use(),
        )

    def heartbeat(self, force: bool = False) -> None:
        """Rewrite heartbeat.json when a third of the lease has passed (also mid-scan and
        from long commits: one clock read when it is not due, and it never raises)."""
        now = time.monotonic()
        if force or now - self._last_beat >= self.lease / 3:
            self._last_beat = now
            self._seq += 1
            try:
                write_heartbeat(self.ws, self.info())
            except OSError as e:
                if self._beat_failed is None:
                    self.log.problem("heartbeat", f"cannot be written ({e.strerror}); retrying")
                self._beat_failed = e.strerror or str(e)
                # try again soon rather than a third of a lease later
                self._last_beat = now - self.lease / 3 + min(1.0, self.lease / 6)
                return
            if self._beat_failed is not None:
                self._beat_failed = None
                self.log.info("heartbeat: written again")

    def _first_heartbeat(self) -> None:
        """Refuse a lease the heartbeat cannot keep up with on this filesystem."""
        took = 0.0
        for _ in range(3):  # the fastest of three: one scheduling hiccup is not the disk
            t0 = time.monotonic()
            self.heartbeat(force=True)
            took = time.monotonic() - t0
            if self._beat_failed is not None:
                raise FlowError(
                    f"cannot write the heartbeat ({self._beat_failed})",
                    obj=heartbeat_path(self.ws, self.id),
                )
            if took <= self.lease / 6:
                return
        mark_stopped(self.ws, self.id)
        raise UsageError(
            f"a heartbeat took {took:.2f} s to write, more than a sixth of the "
            f"{self.lease:g} s lease: other managers would take this one for dead",
            obj=heartbeat_path(self.ws, self.id),
            hint="raise --lease (or the workspace's lease, `flow init --lease`)",
        )

    # -- the tick ----------------------------------------------------------------

    def locked(self) -> bool:
        now = time.monotonic()
        if now - self._lock_checked > 0.2:
            self._locked = read_lock(self.ws) is not None
            self._lock_checked = now
        return self._locked

    def tick(self) -> TickResult:
        budget = self.config.scan_budget
        if self.ahead.gated:
            if self.draining or self.locked():
                self.local.abandon_all("released: launched ahead, its manager stops claiming")
            self.local.abandon_stale()
        self.heartbeat()
        # heartbeats are watched every tick, not only when recovery asks: observed silence
        # counts only while this manager is looking (see OwnerOracle._read)
        self.oracle.managers()
        # requests before the reap: one made before an attempt ended applies at its commit
        self.inbox.reoffer()
        self.inbox.refresh()
        self.local.check_fenced()
        # then what ended, and jobs launched ahead into the workers it freed (unless a better
        # candidate came meanwhile), before registration and recovery, which may take long
        finished = self._reap()
        started = 0
        free = self.config.workers - len(self.local)
        if free > 0 and self.ahead.gated and not self.draining:
            started = self.local.start_ahead(free, self.claim.best())
            self.attempts_started += started
        # a worker waiting: one batch registered, then the claim, so that the first job starts
        # after one batch rather than after all those submitted (the rest register as it runs)
        waiting = len(self.local) < self.config.workers and self.slots.free_cpus > 0
        actions = self.register.run(min(budget, REGISTER_BATCH) if waiting else budget)
        actions += self.recovery.run(budget)
        actions += self.joins.run(budget, busy=bool(self.local))
        actions += self.dependencies.run()
        actions += self.inbox.sweep(self._mine)
        free = self.config.workers - len(self.local)
        # every job holds at least one CPU: none free, nothing to look for
        if free > 0 and self.slots.free_cpus and not self.draining and not self.locked():
            for c in self.claim.take(free, budget):
                if self.draining or self._spawns_fail():
                    self.claim.release(c)
                    continue
                extra = join_context(self.ws, c.ready_frame)
                if self.local.start(c.handle, c.spec, c.body, extra, c.binding) is not None:
                    started += 1
                    self.attempts_started += 1
                    if self.draining:
                        # a signal during the launch: the drain could not see this one
                        self.local.stop(c.handle.key, interrupted=True)
        room = self.ahead.room(len(self.local))
        if room and not self.draining and not self.locked():
            for c in self.claim.take(room, budget, ahead=True):
                if self._spawns_fail():
                    self.claim.release(c)
                else:
                    self.local.launch_ahead(c, join_context(self.ws, c.ready_frame))
        finished += self._reap()
        return TickResult(actions + started + finished, started, finished)

    def _spawns_fail(self) -> bool:
        """Stop claiming (not running) when spawns keep failing: the node, not the jobs."""
        if (trouble := self.local.spawn_trouble()) and not self.draining:
            self.log.problem("cannot start attempts on this node", trouble)
            self.drain.begin("spawns fail", stop_running=False)
        return trouble is not None

    def _failed_here(self, _job: JobHandle) -> None:
        self.failed_jobs += 1

    def _reap(self) -> int:
        done = self.local.reap()
        for f in done:
            if f.handle is None:
                continue
            st = f.handle.state
            if st is State.FAILED:
                self.failed_jobs += 1
            elif st is State.SUCCEEDED:
                self.succeeded_jobs += 1
            if st is State.READY:
                # our own commit moved it on (an advance, a retry): ours to continue
                self.claim.offer_own(f.handle)
            elif st.is_terminal and f.spec.parent is not None:
                self.joins.child_ended(f.spec.parent.placement, f.spec.parent.key, f.spec.key, st)
        return len(done)

    # -- the loop ----------------------------------------------------------------

    def run(self, install_signals: bool = True) -> int:
        """Serve until drained or idle; returns the exit status for `flow run`."""
        self._first_heartbeat()
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        old: list[tuple[signal.Signals, object]] = []
        if install_signals:
            signal.set_wakeup_fd(wake_w)
            for s in (signal.SIGTERM, signal.SIGINT):
                old.append((s, signal.signal(s, self.drain.on_signal)))
        self.log.info(
            f"manager {self.id} serving {self.ws.root} with {self.config.workers} worker(s)"
        )
        idle_since: float | None = None
        try:
            while not self.drain.exit_now:
                drains_at = self.config.drains_at
                if drains_at is not None and not self.drain.stops and self.clock() >= drains_at:
                    self.drain.begin("walltime reached")
                result = self.tick()
                self._report()
                if self.draining:
                    if not self.local and not self.ahead:
                        break
                    if self.drain.overdue(self.config.drain_timeout):
                        self.local.kill_all()
                # idle: nothing to do here and nothing anyone could still hand us
                if self.config.exit_when_idle is not None and not self.draining:
                    if self._quiet(result):
                        idle_since = idle_since or time.monotonic()
                        if time.monotonic() - idle_since >= self.config.exit_when_idle:
                            # the idle checks trusted the stream's memory of directories;
                            # where a stat may be stale, a stop is decided on listing them
                            if not self._stale_stats or self._nothing_pending(fresh=True):
                                self.left = self._leftover()
                                break
                            idle_since = None
                    else:
                        idle_since = None
                if result.actions == 0 or len(self.local) >= self.config.workers:
                    idle = not (result.actions or self.local or self.draining)
                    self._sleep(wake_r, self.pace.after(idle))
        finally:
            if self.drain.exit_now:
                self.local.kill_all()
                self.log.info("second signal: exiting at once; leases recover the rest")
            elif self.local.leftovers:
                self.local.wait_leftovers()
            if install_signals:
                signal.set_wakeup_fd(-1)
                for signum, handler in old:
                    signal.signal(signum, handler)  # type: ignore[arg-type]
            os.close(wake_r)
            os.close(wake_w)
            if not self.local and not self.ahead:
                mark_stopped(self.ws, self.id)
            self.heartbeat(force=True)
            self._report(final=True)
            if self.left:
                # said even under --quiet: it is why the exit status is not 0
                self.log.problem("stopped with work left", self.left.describe())
            self.log.summary(
                f"manager {self.id} stopped: {self.succeeded} succeeded, {self.failed} failed"
            )
        # a second signal abandons work to the leases: not a clean exit
        if self.failed or self.drain.exit_now:
            return 1
        return EXIT_WORK_LEFT if self.left else 0

    def _report(self, final: bool = False) -> None:
        """Feed the reporter this manager's own numbers, when one is due (or the last)."""
        feed = self.feed
        if feed is None or not (final or feed.due()):
            return
        now = time.monotonic()
        feed.send(
            succeeded=self.succeeded,
            failed=self.failed,
            attempts=self.attempts_started,
            running=[(key, now - la.opened) for key, la in self.local.by_key.items()],
            draining=self.draining,
            final=final,
        )

    def _sleep(self, wake_fd: int, seconds: float) -> None:
        """Until a child exits, a signal arrives, or `seconds` pass.

        A fresh poll set each time: pidfd numbers are reused as attempts come and go, and
        a registration that outlived its descriptor would silently never fire.
        """
        poller = select.poll()
        poller.register(wake_fd, select.POLLIN)
        for fd in self.local.pidfds():
            poller.register(fd, select.POLLIN)
        for fd, _ in poller.poll(seconds * 1000):
            if fd == wake_fd:
                with contextlib.suppress(OSError):
                    os.read(wake_fd, 512)

    def _quiet(self, result: TickResult) -> bool:
        """Nothing was done, nothing runs here, and no job anywhere could still come our way.

        Waiting jobs are released by the join pass, so while any exist the join stream
        must also have gone round once since the last action.
        """
        marks = (self.register.stream.cycles, self.claim.stream.cycles, self.joins.stream.cycles)
        if result.actions or self.local or self.ahead:
            self._idle_marks = marks
            return False
        if not self._nothing_pending():
            return False
        if any_marker(self.ws, State.WAITING, self.config.placements):
            return all(m >= o + 1 for m, o in zip(marks, self._idle_marks, strict=True))
        return True

    def _nothing_pending(self, *, fresh: bool = False) -> bool:
        """No job is being registered, run or committed anywhere, and none we serve is
        ready (in backoff or not yet reached by our scan). `fresh`: the ready jobs' every
        directory listed, none taken as remembered unchanged by one stat: a shared
        filesystem's client may cache a directory's attributes, and miss a rename into
        it, for a minute (a directory found holding ours is the stream's to list again)."""
        for st in (
            State.SUBMITTED,
            State.CLAIMED,
            State.RUNNING,
            State.COMMITTING,
            State.CANCELLING,
        ):
            if any_marker(self.ws, st, self.config.placements):
                return False
        self._looked = look_ready(self.claim, self.config.placements, fresh=fresh)
        return not self._looked.pending

    def _leftover(self) -> Leftover:
        """What is left that this manager serves but could not do (it stops idle): the
        ready jobs as the idle check that decided it just found them."""
        return leftover(self.ws, self.claim, self.config.placements, self._looked)
