"""The workspace at a glance: counts per state from marker names alone, managers, blockers."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from httk_flow.errors import FlowError
from httk_flow.ops.fit import (
    START_SLACK,
    Capacity,
    QueueTimes,
    TimeRequests,
    allocation_walltime,
    capacity,
    too_big,
    unfit,
)
from httk_flow.ops.managers import DeadHold, ManagerView, look
from httk_flow.ops.select import Selection, matcher
from httk_flow.protocol import layout, requests
from httk_flow.protocol.counting import count_after, count_markers, tally_markers
from httk_flow.protocol.discovery import walk_all
from httk_flow.protocol.fsio import fs
from httk_flow.protocol.groups import GroupRegistry
from httk_flow.protocol.leases import Liveness, read_managers
from httk_flow.protocol.maintenance import read_lock
from httk_flow.protocol.names import from36, marker_service
from httk_flow.protocol.services import ServiceRegistry
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

GroupBy = Literal["state", "placement", "step", "tag", "group"]
#: ready markers of a class the time fit's walk builds a handle for, per job it may read:
#: at a million jobs a handle each would cost seconds. Beyond it, the sample comes from
#: the directories walked first (a default shard holds jobs by their ids' first digits)
WALK_PER_SAMPLE = 10

#: what the reconciler sizes allocations with (it reads the workspace through this module)
__all__ = [
    "START_SLACK",
    "GroupBy",
    "Liveness",
    "QueueTimes",
    "Snapshot",
    "StatusReport",
    "Throughput",
    "TimeRequests",
    "allocation_walltime",
    "watch",
    "workspace_status",
]


@dataclass
class StatusReport:
    workspace: str
    counts: dict[State, int]
    managers: list[Liveness]
    blocked: list[tuple[str, int]]
    groups: dict[str, Counter[State]] = field(default_factory=dict)
    #: operator requests not yet applied or retired (pause, priority of running jobs)
    requests_pending: int = 0
    #: the numbers behind a blocked reason (the time fit's), by reason
    details: dict[str, dict[str, object]] = field(default_factory=dict)
    #: ready jobs no live manager can claim, now or after a backoff
    stuck_ready: int = 0
    #: the declared times of ready (and, when asked for, submitted) jobs, by service class
    ready_times: dict[str, QueueTimes] = field(default_factory=dict)
    submitted_times: dict[str, QueueTimes] = field(default_factory=dict)
    #: by service class of ready jobs: what the live managers serving it can take on
    #: (None: none serves it); `locked`: the maintenance lock holds every claim back
    capacities: dict[str, Capacity | None] = field(default_factory=dict)
    locked: bool = False
    #: the managers the listings show (live ones, and dead ones holding jobs or heard from
    #: lately), with what each that is not alive holds
    listed: list[ManagerView] = field(default_factory=list)
    #: jobs held by managers that are not alive, and when each is recovered
    held_by_dead: list[DeadHold] = field(default_factory=list)
    #: this host's clock when the managers were read
    looked_at: float = 0.0

    def can_claim(self, service: str, needs: float | None) -> bool:
        """Whether a live manager could claim a ready job of this class and time."""
        if self.locked or service not in self.capacities:
            return False
        cap = self.capacities[service]
        if cap is None:
            return False
        return needs is None or cap.longest is None or needs <= cap.longest

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def live_managers(self) -> list[Liveness]:
        return [m for m in self.managers if m.alive]


def workspace_status(
    ws: Workspace,
    *,
    by: GroupBy = "state",
    now: float | None = None,
    times: TimeRequests | None = None,
    submitted_times: bool = False,
    sel: Selection | None = None,
) -> StatusReport:
    """Count every marker by name and explain what is stuck.

    No job file is opened but a bounded sample of ready jobs' job.json: the marker name
    carries a job's service class, not its declared time, which the walltime fit needs
    (ops/fit.py; `times` keeps what was read for the next look). With `submitted_times`,
    submitted jobs' times are sampled too (the reconciler's demand). With `sel`, only
    the jobs its tags, groups and states pick are counted (by their names too)."""
    wall = time.time() if now is None else now
    counts: dict[State, int] = dict.fromkeys(State, 0)
    groups: dict[str, Counter[State]] = {}
    waiting_classes: Counter[str] = Counter()
    backoff = 0
    deps: int | None = None  # waiting jobs whose dependencies have not all ended
    times = times or TimeRequests(ws)
    ready_look, submitted_look = times.look(), times.look()
    keep = matcher(ws, sel) if sel is not None and sel.filters_but_all else None
    registry = ServiceRegistry(ws)
    group_names = GroupRegistry(ws)
    # by state, only counts are shown: ready jobs are counted by name too, and walked
    # (for the time fit's sample) only for classes a live manager with an end serves
    by_name = by == "state" and keep is None and not submitted_times
    for st in State:
        walk = st is State.READY or (st is State.SUBMITTED and submitted_times)
        if keep is not None and sel is not None and sel.states and st not in sel.states:
            continue
        if st is State.READY and by_name:
            for (nb, cid), n in tally_markers(ws, st, split=True).items():
                counts[st] += n
                waiting_classes[cid or ""] += n
                if nb is not None and from36(nb) > wall:
                    backoff += n
            continue
        if by == "state" and not walk and keep is None:
            # only names are needed here: count them without building a handle each
            if st is State.WAITING:
                counts[st], deps = count_after(ws, st, split=True)
            else:
                counts[st] = count_markers(ws, st, split=True)
            continue
        for h in walk_all(ws, st):
            if keep is not None and not keep(h):
                continue
            counts[st] += 1
            if st is State.READY:
                waiting_classes[h.marker.service] += 1
                ready_look.see(h)
                if h.marker.not_before > wall:
                    backoff += 1
            elif st is State.SUBMITTED and submitted_times:
                submitted_look.see(h)
            if by == "placement":
                groups.setdefault(h.placement, Counter())[st] += 1
            elif by == "tag":
                groups.setdefault(h.marker.tag or "-", Counter())[st] += 1
            elif by == "group":
                d = h.marker.group_digest
                name = (group_names.name_of(d) or f"?{d}") if d else "-"
                groups.setdefault(name, Counter())[st] += 1
            elif by == "step":
                try:
                    step = ws.reader.frame(h.marker.ref).snap.step or "?"
                except FlowError:
                    step = "?"
                groups.setdefault(step, Counter())[st] += 1
    managers = read_managers(ws)
    seen = look(ws, managers)
    live = [m for m in managers if m.alive]
    caps: dict[str, Capacity | None] = {}
    for cid in waiting_classes:
        sc = registry.get(cid)
        caps[cid] = capacity(live, sc, wall) if sc is not None else None
    # job.json is read only where a live manager's end could be too near for a job
    fit = {cid for cid, cap in caps.items() if cap is not None and cap.longest is not None}
    if by_name:
        cut: set[str] = set()  # classes whose walk stopped at the bound
        if fit:
            want = {cid: WALK_PER_SAMPLE * times.per_class for cid in fit}
            for h in walk_all(
                ws,
                State.READY,
                names=lambda name: marker_service(name) in want,
                classes=lambda cid: cid in want,
            ):
                ready_look.see(h)
                cid = h.marker.service
                want[cid] -= 1
                if not want[cid]:
                    del want[cid]
                    cut.add(cid)
                    if not want:
                        break
        for cid, n in waiting_classes.items():
            # a class not walked (or whose jobs all moved on since they were counted)
            q = ready_look.by.setdefault(cid, QueueTimes(n))
            if cid in cut:
                q.n = max(q.n, n)  # the sample stands for all that were counted
    ready_times = ready_look.finish(None if submitted_times else fit)
    blocked: list[tuple[str, int]] = []
    details: dict[str, dict[str, object]] = {}
    lock = read_lock(ws)
    if lock is not None and counts[State.READY]:
        blocked.append(
            (
                f"maintenance lock held ({lock.describe()}); release it with `flow unlock`",
                counts[State.READY],
            )
        )
    # ready jobs no live manager can claim: all of them under the lock
    stuck = counts[State.READY] if lock is not None else 0
    for cid, n in sorted(waiting_classes.items()):
        sc, cap = registry.get(cid), caps[cid]
        too_long = unfit(ready_times[cid], cap) if cap is not None else None
        if sc is None:
            blocked.append((f"service class {cid!r} is unreadable; run `flow fsck`", n))
        elif not live:
            blocked.append(("no live manager; start one with `flow serve` or `flow run`", n))
        elif (big := too_big(live, sc)) is not None:
            blocked.append((big, n))
        elif cap is None:
            serve = " ".join(
                ["flow serve"]
                + [f"--pool {sc.pool}"] * bool(sc.pool)
                + [f"--capability {c}" for c in sc.requires]
            )
            blocked.append((f"no live manager serves {sc.describe()}; start one with `{serve}`", n))
        elif too_long is not None:
            # no live manager that serves it has the time its declared run needs
            blocked.append((too_long.reason(), too_long.count))
            details[too_long.reason()] = too_long.details()
            n = too_long.count
        else:
            continue
        if lock is None:
            stuck += n
    if counts[State.SUBMITTED] and not live:
        blocked.append(
            (
                "no live manager to register submissions; start one with `flow serve` "
                "or `flow run`",
                counts[State.SUBMITTED],
            )
        )
    if backoff:
        blocked.append(("waiting out a retry backoff", backoff))
    if counts[State.WAITING]:
        # by name alone: `.a` marks a job whose dependencies (--after) have not all ended
        if deps is None:
            deps = sum(
                1
                for h in walk_all(ws, State.WAITING)
                if h.marker.after and (keep is None or keep(h))
            )
        if deps:
            blocked.append(
                ("waiting for dependencies that have not ended (`flow show JOB` names them)", deps)
            )
    paused = None
    # the allocation records' module only if there is a pause to read (importing it is most
    # of what this check would cost)
    if counts[State.READY] and fs.exists(layout.allocations_paused(ws.root)):
        from httk_flow.scale.allocation_records import AllocationStore  # lazy: it reads status

        paused = AllocationStore(ws).paused()
    if paused:
        blocked.append((f"allocation queue paused: {paused}", counts[State.READY]))
    merged: Counter[str] = Counter()
    for reason, n in blocked:
        merged[reason] += n
    pending = sum(1 for n in requests.pending_names(ws) if requests.parse_name(n) is not None)
    return StatusReport(
        ws.root,
        counts,
        managers,
        list(merged.items()),
        groups,
        pending,
        details,
        min(stuck, counts[State.READY]),
        ready_times,
        submitted_look.finish() if submitted_times else {},
        caps if live else {},
        lock is not None,
        seen.views(),
        seen.dead,
        seen.now,
    )


class Throughput:
    """Jobs finished per second over a sliding window, and the ETA of what remains."""

    def __init__(self, window: float = 60.0) -> None:
        self.window = window
        self._samples: list[tuple[float, int]] = []

    def add(self, report: StatusReport, now: float) -> None:
        done = sum(report.counts[s] for s in State if s.is_terminal)
        self._samples.append((now, done))
        while len(self._samples) > 2 and now - self._samples[0][0] > self.window:
            self._samples.pop(0)

    @property
    def rate(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, d0), (t1, d1) = self._samples[0], self._samples[-1]
        return max(0.0, (d1 - d0) / (t1 - t0)) if t1 > t0 else 0.0

    def eta(self, report: StatusReport) -> float | None:
        remaining = sum(report.counts[s] for s in State if not s.is_terminal)
        r = self.rate
        return remaining / r if r > 0 and remaining else None


@dataclass(frozen=True)
class Snapshot:
    """One look at the workspace while watching it, and the pace so far."""

    report: StatusReport
    #: seconds since the watch began
    elapsed: float
    #: jobs finished per second over the throughput window
    rate: float
    #: seconds until what remains is done at that rate, when there is a rate
    eta: float | None


def watch(
    ws: Workspace,
    *,
    by: GroupBy = "state",
    every: float = 2.0,
    until: Callable[[Snapshot], bool] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    sel: Selection | None = None,
) -> Iterator[Snapshot]:
    """A snapshot now and then one every `every` seconds, until `until(snapshot)` is true
    or the caller stops iterating: the one loop that watches a workspace for a user.

    The interval is kept on the monotonic clock; a look that takes longer than the
    interval is followed by the next at once, not by a burst of catching up."""
    tp = Throughput()
    times = TimeRequests(ws)  # what one look read, the next need not read again
    start = due = clock()
    while True:
        report = workspace_status(ws, by=by, times=times, sel=sel)
        now = clock()
        tp.add(report, now)
        snap = Snapshot(report, now - start, tp.rate, tp.eta(report))
        yield snap
        if until is not None and until(snap):
            return
        due += every
        delay = due - clock()
        if delay > 0:
            sleep(delay)
        else:
            due = clock()
