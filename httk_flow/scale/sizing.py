"""Allocations sized to the work: the walltime that fits the longest queued request
before the drain and the batch system's early signal, and which queued work no allocation
the reconciler would submit can fit (not demand: said, not paid for)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from httk_flow.ops.status import (
    START_SLACK,
    Liveness,
    QueueTimes,
    StatusReport,
    allocation_walltime,
)
from httk_flow.protocol.durations import compact_duration
from httk_flow.protocol.states import State


@dataclass(frozen=True)
class ScaleSettings:
    max: int = 4
    min: int = 0
    jobs_per_manager: int = 100
    serve_args: tuple[str, ...] = ()
    time: float | None = None
    drain: float = 120.0
    extra_args: tuple[str, ...] = ()
    backoff_base: float = 30.0
    #: the longest walltime an allocation may be given so that queued work fits in it
    #: (None: never longer than `time`)
    max_time: float | None = None
    #: how much earlier than `drain` the batch system may signal (None: the backend's own)
    margin: float | None = None


@dataclass(frozen=True)
class Demand:
    """What the queue asks of the allocations this reconciler submits."""

    #: allocations wanted
    want: int
    #: queued jobs that an allocation it would submit can fit
    queued: int
    #: the walltime to ask for (None: the backend's default)
    walltime: float | None
    #: of the fitting queued jobs: the shortest declared time, and whether any declares
    #: none (any allocation serves those)
    shortest: float | None
    untimed: bool
    unfit: int = 0
    unfit_reason: str = ""


class Sizing:
    """The reconciler's arithmetic of walltimes: what an allocation keeps back (the drain
    and the signal margin) and what it leaves for work."""

    def __init__(self, settings: ScaleSettings, backend_margin: float) -> None:
        self.settings = settings
        margin = settings.margin if settings.margin is not None else backend_margin
        #: what an allocation keeps back before its end: the drain and the signal margin
        self.reserve = settings.drain + margin

    def usable(self, walltime: float) -> float:
        """Seconds of claimable time an allocation of this walltime gives its manager."""
        return walltime - self.reserve - START_SLACK

    def longest_walltime(self) -> float | None:
        """The longest walltime this reconciler would ask for (None: the default's)."""
        s = self.settings
        if s.max_time is not None:
            return max(s.max_time, s.time or 0.0)
        return s.time

    def demand(self, r: StatusReport) -> Demand:
        """The allocations wanted: one per `jobs_per_manager` of the queued jobs that an
        allocation it would submit can fit and of the active ones; and the walltime that
        fits the longest of those requests (from `time` up to `max_time`). `r` is a
        status with the times of submitted jobs sampled too."""
        queue = QueueTimes()
        for q in [*r.ready_times.values(), *r.submitted_times.values()]:
            queue = queue.merged(q)
        longest_wall = self.longest_walltime()
        room = self.usable(longest_wall) if longest_wall is not None else None

        def fits(t: float | None) -> bool:
            return t is None or room is None or t <= room

        unfit = queue.count(lambda t: not fits(t))
        queued = max(0, queue.n - unfit)
        fitting = [t for t in queue.read if t is not None and fits(t)]
        active = sum(r.counts[st] for st in State if st.is_active)
        work = queued + active
        s = self.settings
        want = math.ceil(work / max(1, s.jobs_per_manager)) if work else 0
        reason = ""
        if unfit and longest_wall is not None:
            need = max(t for t in queue.read if t is not None and not fits(t))
            reason = (
                f"need up to {compact_duration(need)}, more than an allocation of "
                f"{compact_duration(longest_wall)} leaves before its drain; give --max-time "
                f"{compact_duration(allocation_walltime(need, self.reserve))} or more"
            )
        return Demand(
            want=max(s.min, min(s.max, want)),
            queued=queued,
            walltime=self._walltime(max(fitting) if fitting else None),
            shortest=min(fitting) if fitting else None,
            untimed=None in queue.read or (queued > 0 and not queue.read),
            unfit=unfit,
            unfit_reason=reason,
        )

    def _walltime(self, need: float | None) -> float | None:
        """`time`, or longer (up to `max_time`) when the longest fitting request needs it."""
        s = self.settings
        if need is None or s.max_time is None:
            return s.time
        wall = allocation_walltime(need, self.reserve)
        if s.time is not None and s.time >= wall:
            return s.time
        return min(max(wall, s.time or 0.0), self.longest_walltime() or wall)


def idle_why(lv: Liveness | None) -> str:
    """Why an allocation whose manager this was started no attempt (its last heartbeat)."""
    if lv is None:
        return "no manager heartbeated from it (see its log)"
    info = lv.info
    if info.unfit:
        usable = (
            compact_duration(max(0.0, info.ends_at - info.started))
            if info.ends_at is not None
            else "?"
        )
        need = compact_duration(info.unfit_need or 0.0)
        jobs = f"{info.unfit} ready job{'s' * (info.unfit != 1)}"
        return f"{jobs} needed up to {need}, more than the {usable} its manager could use"
    return "no job it serves was ready for it while it ran"
