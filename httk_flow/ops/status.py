"""The workspace at a glance: counts per state from marker names alone, managers, blockers."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from httk_flow.errors import FlowError
from httk_flow.protocol import requests
from httk_flow.protocol.discovery import count_markers, walk_all
from httk_flow.protocol.leases import Liveness, read_managers
from httk_flow.protocol.maintenance import read_lock
from httk_flow.protocol.services import ServiceRegistry
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

GroupBy = Literal["state", "placement", "step", "tag"]


@dataclass
class StatusReport:
    workspace: str
    counts: dict[State, int]
    managers: list[Liveness]
    blocked: list[tuple[str, int]]
    groups: dict[str, Counter[State]] = field(default_factory=dict)
    #: operator requests not yet applied or retired (pause, priority of running jobs)
    requests_pending: int = 0

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def live_managers(self) -> list[Liveness]:
        return [m for m in self.managers if m.alive]


def workspace_status(
    ws: Workspace, *, by: GroupBy = "state", now: float | None = None
) -> StatusReport:
    """Count every marker by name (no job file is opened) and explain what is stuck."""
    wall = time.time() if now is None else now
    counts: dict[State, int] = dict.fromkeys(State, 0)
    groups: dict[str, Counter[State]] = {}
    waiting_classes: Counter[str] = Counter()
    backoff = 0
    for st in State:
        if by == "state" and st is not State.READY:
            # only names are needed here: count them without building a handle each
            counts[st] = count_markers(ws, st)
            continue
        for h in walk_all(ws, st):
            counts[st] += 1
            if st is State.READY:
                waiting_classes[h.marker.service] += 1
                if h.marker.not_before > wall:
                    backoff += 1
            if by == "placement":
                groups.setdefault(h.placement, Counter())[st] += 1
            elif by == "tag":
                groups.setdefault(h.marker.tag or "-", Counter())[st] += 1
            elif by == "step":
                try:
                    step = ws.reader.frame(h.marker.ref).snap.step or "?"
                except FlowError:
                    step = "?"
                groups.setdefault(step, Counter())[st] += 1
    managers = read_managers(ws)
    live = [m for m in managers if m.alive]
    blocked: list[tuple[str, int]] = []
    lock = read_lock(ws)
    if lock is not None and counts[State.READY]:
        blocked.append(
            (
                f"maintenance lock held ({lock.describe()}); release it with `flow unlock`",
                counts[State.READY],
            )
        )
    registry = ServiceRegistry(ws)
    for cid, n in sorted(waiting_classes.items()):
        sc = registry.get(cid)
        if sc is None:
            blocked.append((f"service class {cid!r} is unreadable; run `flow fsck`", n))
            continue
        if not live:
            blocked.append(("no live manager; start one with `flow serve` or `flow run`", n))
        elif not any(sc.served_by(m.info.pools, m.info.capabilities) for m in live):
            opts = " ".join(
                [f"--pool {sc.pool}"] * bool(sc.pool) + [f"--capability {c}" for c in sc.requires]
            )
            blocked.append(
                (f"no live manager serves {sc.describe()}; start one with `flow serve {opts}`", n)
            )
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
    from httk_flow.scale.allocation_records import AllocationStore  # lazy: allocations reads status

    paused = AllocationStore(ws).paused()
    if paused and counts[State.READY]:
        blocked.append((f"allocation queue paused: {paused}", counts[State.READY]))
    merged: Counter[str] = Counter()
    for reason, n in blocked:
        merged[reason] += n
    pending = sum(1 for n in requests.pending_names(ws) if requests.parse_name(n) is not None)
    return StatusReport(ws.root, counts, managers, list(merged.items()), groups, pending)


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
) -> Iterator[Snapshot]:
    """A snapshot now and then one every `every` seconds, until `until(snapshot)` is true
    or the caller stops iterating: the one loop that watches a workspace for a user.

    The interval is kept on the monotonic clock; a look that takes longer than the
    interval is followed by the next at once, not by a burst of catching up."""
    tp = Throughput()
    start = due = clock()
    while True:
        report = workspace_status(ws, by=by)
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
