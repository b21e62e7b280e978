"""Allocations sized to the work: per service class of the queued jobs, the walltime that
fits the longest queued request before the drain and the batch system's early signal and
the shape that fits the request (scale/shapes.py); and which queued work no allocation the
reconciler would submit can fit (not demand: said, not paid for)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from httk_flow.ops.status import (
    START_SLACK,
    Liveness,
    QueueTimes,
    StatusReport,
    allocation_walltime,
)
from httk_flow.protocol.durations import compact_duration
from httk_flow.protocol.services import DEFAULT_CLASS, ServiceClass
from httk_flow.protocol.states import State
from httk_flow.scale.backends.base import AllocationProfile, NodeLimits
from httk_flow.scale.shapes import Group, Offer, fit, merged_limits


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
    #: the most one node of an allocation may have (None: as the backend knows, else one
    #: job's worth of what the jobs ask for); memory in bytes
    cpus_per_node: int | None = None
    gpus_per_node: int | None = None
    mem_per_node: int | None = None
    #: the most nodes one allocation may have (one manager runs on each)
    max_nodes: int = 1


@dataclass(frozen=True)
class Demand:
    """What the queue asks of the allocations this reconciler submits."""

    #: allocations wanted, in all
    want: int
    #: queued jobs that an allocation it would submit can fit
    queued: int
    #: the longest walltime asked for a group with queued work (None: the backend's default)
    walltime: float | None
    unfit: int = 0
    unfit_reason: str = ""
    #: the queued and active jobs by service class, each with its allocation shape
    groups: tuple[Group, ...] = ()
    #: what an allocation kept for `--min` alone is asked for
    fallback: Group = field(default_factory=lambda: Group("", DEFAULT_CLASS, 0))


@dataclass(frozen=True)
class TimeFit:
    """The queued jobs of one class against the walltimes the reconciler may ask for."""

    fitting: int
    unfit: int
    reason: str
    walltime: float | None
    shortest: float | None
    untimed: bool


class Sizing:
    """The reconciler's arithmetic of walltimes: what an allocation keeps back (the drain
    and the signal margin) and what it leaves for work; and of shapes, per service class."""

    def __init__(
        self, settings: ScaleSettings, backend_margin: float, known: NodeLimits | None = None
    ) -> None:
        self.settings = settings
        margin = settings.margin if settings.margin is not None else backend_margin
        #: what an allocation keeps back before its end: the drain and the signal margin
        self.reserve = settings.drain + margin
        #: what every manager it starts serves (its serve arguments)
        self.offer = Offer.from_serve_args(settings.serve_args)
        #: the most a node may have: the user's limits, else what the backend knows
        self.limits = merged_limits(
            cpus=settings.cpus_per_node,
            gpus=settings.gpus_per_node,
            mem=settings.mem_per_node,
            nodes=settings.max_nodes,
            known=known or NodeLimits(),
        )

    def usable(self, walltime: float) -> float:
        """Seconds of claimable time an allocation of this walltime gives its manager."""
        return walltime - self.reserve - START_SLACK

    def longest_walltime(self) -> float | None:
        """The longest walltime this reconciler would ask for (None: the default's)."""
        s = self.settings
        if s.max_time is not None:
            return max(s.max_time, s.time or 0.0)
        return s.time

    def time_fit(self, queue: QueueTimes) -> TimeFit:
        """Which queued jobs an allocation it would submit has the time for, and the
        walltime that fits the longest of those (from `time` up to `max_time`)."""
        longest_wall = self.longest_walltime()
        room = self.usable(longest_wall) if longest_wall is not None else None

        def fits(t: float | None) -> bool:
            return t is None or room is None or t <= room

        unfit = queue.count(lambda t: not fits(t))
        fitting = [t for t in queue.read if t is not None and fits(t)]
        reason = ""
        if unfit and longest_wall is not None:
            need = max(t for t in queue.read if t is not None and not fits(t))
            reason = (
                f"need up to {compact_duration(need)}, more than an allocation of "
                f"{compact_duration(longest_wall)} leaves before its drain; give --max-time "
                f"{compact_duration(allocation_walltime(need, self.reserve))} or more"
            )
        queued = max(0, queue.n - unfit)
        return TimeFit(
            fitting=queued,
            unfit=unfit,
            reason=reason,
            walltime=self._walltime(max(fitting) if fitting else None),
            shortest=min(fitting) if fitting else None,
            untimed=None in queue.read or (queued > 0 and not queue.read),
        )

    def demand(
        self,
        r: StatusReport,
        *,
        classes: Callable[[str], ServiceClass | None] = lambda cid: None if cid else DEFAULT_CLASS,
        active: Mapping[str, int] | None = None,
    ) -> Demand:
        """The allocations wanted, per service class of the queued (ready and submitted)
        jobs its managers would serve: one per `jobs_per_manager` of those an allocation
        fits and of the active ones, in the shape that fits the class (shapes.fit), with
        the walltime its longest request needs. `r` is a status with the times of
        submitted jobs sampled too; `active` the jobs managers hold, by class (None: the
        status's count, all taken for the default class)."""
        s = self.settings
        if active is None:
            n = sum(r.counts[st] for st in State if st.is_active)
            active = {"": n} if n else {}
        queues: dict[str, QueueTimes] = {}
        for by in (r.ready_times, r.submitted_times):
            for cid, q in by.items():
                queues[cid] = queues.get(cid, QueueTimes()).merged(q)
        groups = [
            self._group(cid, classes(cid), queues.get(cid, QueueTimes()), active.get(cid, 0))
            for cid in sorted(set(queues) | set(active))
        ]
        groups = [g for g in groups if g.queued or g.active or g.unfit]
        unfit = [g for g in groups if g.unfit]
        if len(unfit) == 1:
            reason = unfit[0].unfit_reason
        else:
            reason = " | ".join(
                f"{g.unfit} job{'s' * (g.unfit != 1)} of {g.describe()}: {g.unfit_reason}"
                for g in unfit
            )
        walls = [g.walltime for g in groups if g.queued and g.walltime is not None]
        fallback = fit(DEFAULT_CLASS.need, 1, self.limits, self.offer)
        return Demand(
            want=max(s.min, min(s.max, sum(g.want for g in groups))),
            queued=sum(g.queued for g in groups),
            walltime=max(walls) if walls else s.time,
            unfit=sum(g.unfit for g in groups),
            unfit_reason=reason,
            groups=tuple(groups),
            fallback=Group(
                "",
                DEFAULT_CLASS,
                0,
                profile=fallback if isinstance(fallback, AllocationProfile) else None,
                walltime=s.time,
            ),
        )

    def _group(self, cid: str, sc: ServiceClass | None, queue: QueueTimes, active: int) -> Group:
        s = self.settings
        if sc is None:
            why = f"its service class {cid!r} is unreadable; run `flow fsck`"
            return Group(cid, None, 0, unfit=queue.n, unfit_reason=why if queue.n else "")
        if not self.offer.serves(sc):
            # managers it starts never claim these: not its demand, and not its jobs
            why = self.offer.why_not(sc) if queue.n else ""
            return Group(cid, sc, 0, unfit=queue.n, unfit_reason=why)
        t = self.time_fit(queue)
        per = max(1, s.jobs_per_manager)
        # the jobs one allocation of the group takes on: its share of the queue
        jobs = math.ceil(t.fitting / math.ceil(t.fitting / per)) if t.fitting else 1
        shape = fit(sc.need, jobs, self.limits, self.offer)
        if isinstance(shape, str):
            return Group(
                cid,
                sc,
                0,
                active,
                math.ceil(active / per),
                unfit=queue.n,
                unfit_reason=shape if queue.n else "",
            )
        work = t.fitting + active
        return Group(
            cid,
            sc,
            t.fitting,
            active,
            math.ceil(work / per) if work else 0,
            shape,
            t.walltime,
            t.shortest,
            t.untimed,
            t.unfit,
            t.reason,
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
