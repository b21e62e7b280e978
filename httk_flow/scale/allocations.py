"""The allocation reconciler: manager allocations kept matched to the queued work.

Desired state (from the queue) against observed state (from the backend), one idempotent
step per allocation per tick. A record is written before every submission and carries a
token minted before it, so a crash or an unknown answer is resolved by asking the
backend for the token, never by submitting blindly again.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from httk_flow.errors import UsageError
from httk_flow.ops.status import Liveness, TimeRequests, workspace_status
from httk_flow.protocol import layout
from httk_flow.protocol.durations import compact_duration
from httk_flow.protocol.leases import read_managers
from httk_flow.protocol.names import to36
from httk_flow.protocol.services import ServiceRegistry
from httk_flow.protocol.workspace import Workspace
from httk_flow.scale.allocation_records import (
    AllocationRecord,
    AllocationStore,
    AllocPhase,
    ReconcilerLease,
)
from httk_flow.scale.backends.base import (
    AllocationBackend,
    AllocationRequest,
    BackendUnavailable,
    Outcome,
    Phase,
    node_limits,
)
from httk_flow.scale.shapes import Group, active_by_class, plan
from httk_flow.scale.sizing import Demand, ScaleSettings, Sizing, idle_why
from httk_flow.scale.stopping import StopNow, StopSignals

__all__ = [
    "AllocPhase",
    "AllocationRecord",
    "AllocationStore",
    "Demand",
    "Reconciler",
    "ReconcilerLease",
    "ScaleSettings",
    "TickReport",
]

#: failures in a row (allocations that never ran) before the queue is paused
PAUSE_AFTER = 3


@dataclass
class TickReport:
    desired: int = 0
    active: int = 0
    submitted: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    adopted: list[str] = field(default_factory=list)
    unavailable: str = ""
    paused: str = ""
    #: the walltime new allocations are asked for (seconds; None: the backend's default)
    walltime: float | None = None
    #: queued jobs no allocation it would submit can fit (not demand), and why
    unfit: int = 0
    unfit_reason: str = ""
    #: allocations cancelled because they cannot serve what is queued
    replaced: list[str] = field(default_factory=list)
    #: the shape of each submitted allocation, in the order of `submitted`
    submitted_shapes: list[str] = field(default_factory=list)
    #: the queued and active jobs by service class, each with the shape asked for it
    shapes: list[dict[str, object]] = field(default_factory=list)


class Reconciler:
    def __init__(
        self,
        ws: Workspace,
        backend: AllocationBackend,
        settings: ScaleSettings,
        *,
        clock: Callable[[], float] = time.time,
        fault: Callable[[str], None] | None = None,
    ) -> None:
        self.ws = ws
        self.backend = backend
        self.settings = settings
        self.clock = clock
        self.store = AllocationStore(ws)
        self.owner = "r" + to36(secrets.randbits(40))
        self._draining: set[str] = set()
        #: the manager of each allocation, by token, as its heartbeat last said
        self._managers: dict[str, Liveness] = {}
        #: declared times of queued jobs, read a bounded sample per tick and kept
        self.times = TimeRequests(ws)
        self.sizing = Sizing(settings, backend.signal_margin, node_limits(backend))
        self.registry = ServiceRegistry(ws)
        #: a test seam: called with "after_submit" between the backend's answer and the
        #: record that stores it, to model a crash there
        self.fault = fault
        #: the signal that stopped `run` (None: it was not stopped by one)
        self.stopped_by: int | None = None

    # -- desired -----------------------------------------------------------------

    def desired(self) -> Demand:
        """The allocations the queue wants, by service class, each with its shape and
        walltime (scale/sizing.py): class files are read once, never a job.json per job."""
        status = workspace_status(self.ws, times=self.times, submitted_times=True)
        return self.sizing.demand(
            status, classes=self.registry.get, active=active_by_class(self.ws)
        )

    # -- one tick ------------------------------------------------------------------

    def tick(self) -> TickReport:
        report = TickReport()
        records = [r for r in self.store.load_all() if r.backend == self.backend.name]
        try:
            records = self._observe(records, report)
        except BackendUnavailable as e:
            report.unavailable = e.render()
            return report  # an unavailable scheduler moves no state
        demand = self.desired()
        report.desired, report.walltime = demand.want, demand.walltime
        report.unfit, report.unfit_reason = demand.unfit, demand.unfit_reason
        report.shapes = [g.to_json() for g in demand.groups]
        busy = self._busy()
        records = self._replace_useless(records, demand, busy, report)
        active = [r for r in records if r.phase.active]
        report.active = len(active)
        # allocations still winding down count against --max until they are gone
        winding = sum(1 for r in records if r.phase is AllocPhase.CANCELLING)
        room = max(0, self.settings.max - len(active) - winding)
        paused = self.store.paused()
        if paused is None:
            paused = self._failures(records)
        report.paused = paused or ""
        steps = plan(
            active,
            demand.groups,
            room=room,
            minimum=min(self.settings.min, self.settings.max),
            busy=busy,
            fallback=demand.fallback,
        )
        if steps.surplus:
            self._shrink(steps.surplus, report)
        if steps.submit and not paused and not self._backing_off(records):
            for group in steps.submit:
                rec = self._new(group)
                report.submitted.append(rec.token)
                report.submitted_shapes.append(rec.shape)
                self._submit(rec, report)
        return report

    def _put(self, rec: AllocationRecord, **changes: object) -> AllocationRecord:
        new = replace(rec, updated=self.clock(), **changes)  # type: ignore[arg-type]
        self.store.save(new)
        return new

    def _new(self, group: Group) -> AllocationRecord:
        now = self.clock()
        rec = AllocationRecord(
            "a" + secrets.token_hex(8),
            self.backend.name,
            AllocPhase.REQUESTED,
            now,
            now,
            time=group.walltime,
            service=group.service,
            profile=group.profile,
        )
        self.store.save(rec)  # the record exists before the submission does
        return rec

    def _request(self, rec: AllocationRecord) -> AllocationRequest:
        s = self.settings
        return AllocationRequest(
            self.ws.root,
            rec.token,
            s.serve_args,
            # what it was first asked with: a resubmission after an unknown answer too
            rec.time if rec.time is not None else s.time,
            s.drain,
            s.extra_args,
            layout.allocation_logs(self.ws.root),
            s.margin,
            rec.profile,
        )

    def _submit(self, rec: AllocationRecord, report: TickReport) -> AllocationRecord:
        try:
            res = self.backend.submit(self._request(rec))
        except BackendUnavailable as e:
            return self._put(rec, phase=AllocPhase.UNKNOWN, reason=e.render())
        if self.fault is not None:
            self.fault("after_submit")
        if res.outcome in (Outcome.CREATED, Outcome.EXISTING):
            return self._put(rec, phase=AllocPhase.PENDING, handle=res.handle, reason="")
        if res.outcome is Outcome.REJECTED:
            return self._put(rec, phase=AllocPhase.FAILED, reason=res.reason)
        return self._put(rec, phase=AllocPhase.UNKNOWN, reason=res.reason)

    def _observe(
        self, records: list[AllocationRecord], report: TickReport
    ) -> list[AllocationRecord]:
        out = []
        for rec in records:
            if rec.phase is AllocPhase.CANCELLING and not rec.handle:
                handle = self.backend.find_by_token(self.ws.root, rec.token)
                if handle is None:
                    rec = self._put(rec, phase=AllocPhase.CANCELLED, reason="never submitted")
                else:
                    rec = self._put(rec, handle=handle)
                    self.backend.cancel(handle)
            if rec.phase in (AllocPhase.REQUESTED, AllocPhase.UNKNOWN):
                # never submit again without asking whether the first one exists
                handle = self.backend.find_by_token(self.ws.root, rec.token)
                if handle is not None:
                    rec = self._put(
                        rec, phase=AllocPhase.PENDING, handle=handle, reason="adopted by token"
                    )
                    report.adopted.append(rec.token)
                else:
                    rec = self._submit(rec, report)
            out.append(rec)
        handles = [r.handle for r in out if r.handle and not r.phase.ended]
        seen = self.backend.observe(handles) if handles else {}
        # a manager that heartbeated from an allocation proves the allocation ran
        lives = read_managers(self.ws)
        self._managers = {}
        for one in sorted(lives, key=lambda m: (m.alive, m.info.attempts)):
            if one.info.allocation:
                self._managers[one.info.allocation] = one  # the live one, else the busiest
        self._draining = {lv.info.allocation for lv in lives if lv.alive and lv.info.draining}
        final = []
        for rec in out:
            obs = seen.get(rec.handle or "")
            mgr = self._managers.get(rec.token)
            if mgr is not None and (not rec.ran or mgr.info.attempts > rec.attempts):
                rec = self._put(rec, ran=True, attempts=max(rec.attempts, mgr.info.attempts))
            if obs is not None and not rec.phase.ended:
                rec = self._apply(rec, obs.phase, obs.reason)
            final.append(rec)
        return final

    def _idle_why(self, rec: AllocationRecord) -> str:
        """Why an allocation that ran started no attempt, as its manager's heartbeat tells."""
        return idle_why(self._managers.get(rec.token))

    def _busy(self) -> set[str]:
        """Allocations a live manager of which runs or drains attempts (any of its nodes)."""
        return {
            lv.info.allocation
            for lv in read_managers(self.ws)
            if lv.alive and lv.info.allocation and (lv.info.running or lv.info.draining)
        }

    def _replace_useless(
        self, records: list[AllocationRecord], demand: Demand, busy: set[str], report: TickReport
    ) -> list[AllocationRecord]:
        """Cancel allocations that can serve none of their class's queued work (too short
        for every request; idle when running) while an allocation it would submit can:
        they no longer count, and the reconciler submits fitting ones in their place. One
        recorded without a class is judged by the shortest request of all."""
        out = []
        for rec in records:
            need = _shortest_need(rec, demand)
            left = self._time_left(rec)
            if (
                rec.phase.active
                and need is not None
                and left is not None
                and left < need
                and rec.token not in busy
            ):
                why = (
                    f"cannot serve what is queued: the shortest request is "
                    f"{compact_duration(need)}, it has {compact_duration(left)}"
                )
                cancelled = self._cancel(rec, why, report)
                if cancelled is not rec:
                    report.replaced.append(rec.token)
                rec = cancelled
            out.append(rec)
        return out

    def _time_left(self, rec: AllocationRecord) -> float | None:
        """The claimable time an allocation still has or will have (None: unknown)."""
        lv = self._managers.get(rec.token)
        if rec.phase is AllocPhase.RUNNING and lv is not None and lv.alive:
            return lv.info.usable_left(time.time())
        if rec.phase in (AllocPhase.PENDING, AllocPhase.REQUESTED) and rec.time is not None:
            return self.sizing.usable(rec.time)
        return None

    def _cancel(self, rec: AllocationRecord, why: str, report: TickReport) -> AllocationRecord:
        """Mark it cancelling, then cancel it; as it was if the cancel was not sent."""
        marked = self._put(rec, phase=AllocPhase.CANCELLING, reason=why)
        if marked.handle:
            try:
                self.backend.cancel(marked.handle)
            except BackendUnavailable as e:
                report.unavailable = e.render()
                return self._put(marked, phase=rec.phase, reason=f"cancel not sent: {e.render()}")
        report.cancelled.append(marked.token)
        return marked

    def _apply(self, rec: AllocationRecord, phase: Phase, reason: str) -> AllocationRecord:
        if rec.phase is AllocPhase.CANCELLING:
            if phase in (Phase.DONE, Phase.FAILED, Phase.UNKNOWN):
                if rec.ran and not rec.attempts:
                    reason = f"started no attempt: {self._idle_why(rec)}"
                return self._put(rec, phase=AllocPhase.CANCELLED, reason=reason)
            if rec.handle and rec.token not in self._draining:
                # marked but perhaps never cancelled (a crash in between): ask again; a
                # manager already draining is left alone, a second TERM would kill it
                self.backend.cancel(rec.handle)
            return rec
        target = {
            Phase.PENDING: AllocPhase.PENDING,
            Phase.RUNNING: AllocPhase.RUNNING,
            Phase.DONE: AllocPhase.DONE,
            Phase.FAILED: AllocPhase.FAILED,
            Phase.UNKNOWN: AllocPhase.DONE if rec.ran else AllocPhase.FAILED,
        }[phase]
        if target is rec.phase:
            return rec
        ran = rec.ran or phase is Phase.RUNNING
        if target is AllocPhase.DONE and not ran:
            target = AllocPhase.FAILED
            reason = reason or "ended without ever running"
        elif target.ended and ran and not rec.attempts:
            reason = "; ".join(
                x for x in (f"started no attempt: {self._idle_why(rec)}", reason) if x
            )
        return self._put(rec, phase=target, ran=ran, reason=reason)

    def _recent_failures(self, records: list[AllocationRecord]) -> list[AllocationRecord]:
        """Failed allocations since the last one that ran or the last unpause (newest last)."""
        streak: list[AllocationRecord] = []
        since = self.store.unpaused_at()
        for rec in sorted(records, key=lambda r: r.updated):
            if rec.updated <= since:
                continue
            if rec.phase is AllocPhase.FAILED and not rec.ran:
                streak.append(rec)
            elif rec.ran:
                streak = []
        return streak

    def _failures(self, records: list[AllocationRecord]) -> str | None:
        streak = self._recent_failures(records)
        if len(streak) >= PAUSE_AFTER:
            reason = (
                f"{len(streak)} allocations in a row failed to start; last: "
                f"{streak[-1].reason or 'no reason given'}; after fixing the cause "
                "run `flow scale --unpause`"
            )
            self.store.pause(reason)
            return reason
        return None

    def _backing_off(self, records: list[AllocationRecord]) -> bool:
        streak = self._recent_failures(records)
        if not streak:
            return False
        wait = self.settings.backoff_base * 2.0 ** (len(streak) - 1)
        return bool(self.clock() < streak[-1].updated + wait)

    def _shrink(self, victims: list[AllocationRecord], report: TickReport) -> None:
        """Cancel allocations no longer needed (shapes.plan chose them: unstarted ones
        first, then idle managers).

        Every victim is marked cancelling before any is cancelled (one ordered barrier),
        so a crash in between leaves intent on disk and nothing half done."""
        marked = [
            self._put(r, phase=AllocPhase.CANCELLING, reason="no longer needed") for r in victims
        ]
        for before, rec in zip(victims, marked, strict=True):
            if rec.handle:
                try:
                    self.backend.cancel(rec.handle)
                except BackendUnavailable as e:
                    # not (known to be) sent: back as it was, the next tick tries again
                    report.unavailable = e.render()
                    self._put(rec, phase=before.phase, reason=f"cancel not sent: {e.render()}")
                    continue
            report.cancelled.append(rec.token)

    def run(
        self,
        *,
        interval: float,
        once: bool,
        on_tick: Callable[[TickReport], None] | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        install_signals: bool = True,
    ) -> TickReport:
        """Pass after pass (one with `once`) while holding the reconciler lease.

        SIGTERM or SIGHUP ends the loop after the pass it is in (a second one, at once)
        and releases the lease; `stopped_by` then names the signal."""
        lease = ReconcilerLease(self.ws, self.owner, interval)
        report = TickReport()
        with StopSignals(install_signals) as stop:
            try:
                while True:
                    if not lease.acquire():
                        holder = lease.holder
                        raise UsageError(
                            "another `flow scale` is reconciling this workspace"
                            + (f": {holder.describe(time.time())}" if holder else ""),
                            obj="flow scale",
                            hint="stop it (on SIGTERM it ends its pass and releases the lease) "
                            "or wait",
                        )
                    report = self.tick()
                    if on_tick:
                        on_tick(report)
                    if once or should_stop() or stop.signum is not None:
                        return report
                    stop.wait(interval)
                    if stop.signum is not None:
                        return report
            except StopNow:
                return report  # a second signal: the pass ends where it was
            finally:
                stop.disarm()
                lease.release()
                self.stopped_by = stop.signum


def _shortest_need(rec: AllocationRecord, demand: Demand) -> float | None:
    """The shortest declared time of the queued work an allocation could serve (None: some
    of it declares none, or none is queued): its class's; for one recorded without a
    class, that of every class queued."""
    groups = [g for g in demand.groups if g.queued and (rec.service in (None, g.service))]
    if not groups or any(g.untimed or g.shortest is None for g in groups):
        return None
    return min(g.shortest for g in groups if g.shortest is not None)
