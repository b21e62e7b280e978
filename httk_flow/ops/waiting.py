"""Blocking until jobs are terminal: the one place that polls on a user's behalf."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from httk_flow.errors import FlowError
from httk_flow.ops.fit import TimeRequests, steady
from httk_flow.ops.select import Selection, select
from httk_flow.ops.status import workspace_status
from httk_flow.protocol.discovery import walk_all
from httk_flow.protocol.jobs import load_spec
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle, locate_key
from httk_flow.protocol.workspace import Workspace


@dataclass(frozen=True)
class WaitResult:
    total: int
    done: int
    succeeded: int
    failed: int
    cancelled: int
    timed_out: bool

    @property
    def exit_code(self) -> int:
        """CLI.md: 0 all succeeded, 1 some failed or cancelled, 3 timed out."""
        if self.timed_out:
            return 3
        return 0 if self.succeeded == self.total else 1


def waited(ws: Workspace, sel: Selection) -> list[JobHandle] | Selection | None:
    """What `flow wait` waits for: named jobs, or the jobs in the given states now, as
    a fixed list; tags and groups alone as a selection looked at anew each time, so
    jobs submitted meanwhile (a group's children) count; nothing: every job."""
    if not sel.idents and not sel.filters_but_all:
        return None
    if sel.idents or sel.states:
        return list(select(ws, sel))
    return sel


def _snapshot(
    ws: Workspace, jobs: list[JobHandle] | None, sel: Selection | None = None
) -> tuple[list[JobHandle], dict[State, int]]:
    counts = dict.fromkeys(State, 0)
    if sel is not None:
        picked = list(select(ws, sel))
        for h in picked:
            counts[h.state] += 1
        return picked, counts
    if jobs is None:
        for st in State:
            for _ in walk_all(ws, st):
                counts[st] += 1
        return [], counts
    now: list[JobHandle] = []
    for h in jobs:
        cur = h if h.state.is_permanent else (locate_key(ws, h.placement, h.key) or h)
        now.append(cur)
        counts[cur.state] += 1
    return now, counts


#: seconds the waited jobs must stand still before `wait_jobs` asks why
STALL = 2.0
#: seconds between two looks at why nothing moves while nothing does
WHY_EVERY = 5.0
#: the blocked reason that is not one: the job moves once its backoff has passed
_BACKOFF = "waiting out a retry backoff"


def _jobs(n: int, what: str = "job") -> str:
    return f"{n} {what}{'s' * (n != 1)}"


def why_stuck(
    ws: Workspace,
    jobs: list[JobHandle] | None,
    counts: dict[State, int],
    times: TimeRequests,
) -> list[str]:
    """Why none of the waited jobs (all jobs if None; `counts` per state) can move by
    itself; empty when one can (a live manager runs, registers, or could claim one, or
    a backoff will pass). One line per reason."""
    r = workspace_status(ws, times=times)
    live = bool(r.live_managers)
    active = sum(counts[s] for s in State if s.is_active)
    if live and (active or counts[State.SUBMITTED]):
        return []
    moving_elsewhere = live and (
        r.counts[State.READY] > r.stuck_ready or any(r.counts[s] for s in State if s.is_active)
    )
    if jobs is None:
        if r.counts[State.READY] > r.stuck_ready:
            return []
    else:
        for h in jobs:
            if h.state is State.READY and r.can_claim(h.marker.service, _needs(ws, h, times)):
                return []
            if h.state is State.WAITING and moving_elsewhere:
                return []  # its children may be among what moves
    lines = []
    if active:
        lines.append(
            f"{_jobs(active)} claimed or running with no live manager to finish or recover "
            "them; start one with `flow serve` or `flow run`"
        )
    lines += [f"blocked: {_jobs(n)}: {why}" for why, n in r.blocked if why != _BACKOFF]
    if counts[State.PAUSED]:
        lines.append(f"{_jobs(counts[State.PAUSED], 'paused job')}; `flow resume` continues it")
    if counts[State.WAITING]:
        lines.append(f"{_jobs(counts[State.WAITING], 'waiting job')} whose children cannot move")
    return lines


def _needs(ws: Workspace, h: JobHandle, times: TimeRequests) -> float | None:
    if h.key in times.known:
        return times.known[h.key]
    try:
        t = load_spec(ws, h.placement, h.key).time
    except FlowError:
        return None
    times.remember(h.key, t)
    return t


def wait_jobs(
    ws: Workspace,
    jobs: list[JobHandle] | Selection | None,
    *,
    timeout: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    interval: float = 0.5,
    on_stuck: Callable[[list[str]], None] | None = None,
) -> WaitResult:
    """Until every named job (all jobs if None; every job a Selection picks, looked up
    anew each time) is terminal, or the timeout passes.

    When nothing moves, `on_stuck` is told why (one line per reason), once per change of
    the reasons; nothing moves means the counts stood still for STALL seconds and
    `why_stuck` finds no way forward (it looks again every WHY_EVERY seconds)."""
    start = time.monotonic()
    sel = jobs if isinstance(jobs, Selection) else None
    current = None if isinstance(jobs, Selection) else jobs
    times = TimeRequests(ws)
    said: list[str] = []
    last: dict[State, int] | None = None
    still_since, looked = start, -1e18
    while True:
        current_list, counts = _snapshot(ws, current, sel)
        if current is not None:
            current = current_list
        shown = current_list if sel is not None else current
        total = sum(counts.values())
        done = counts[State.SUCCEEDED] + counts[State.FAILED] + counts[State.CANCELLED]
        if progress:
            progress(done, total)
        now = time.monotonic()
        if counts != last:
            last, still_since, looked = counts, now, -1e18
        elif (
            on_stuck is not None
            and done != total
            and now - still_since >= STALL
            and now - looked >= WHY_EVERY
        ):
            looked = now
            why = why_stuck(ws, shown, counts, times)
            if why and [steady(w) for w in why] != [steady(w) for w in said]:
                on_stuck(why)
            said = why
        timed_out = timeout is not None and time.monotonic() - start >= timeout
        if timed_out and done != total and on_stuck is not None and not said:
            # a short timeout: say why now, if nothing can move
            why = why_stuck(ws, shown, counts, times)
            if why:
                on_stuck(why)
        if done == total or timed_out:
            return WaitResult(
                total,
                done,
                counts[State.SUCCEEDED],
                counts[State.FAILED],
                counts[State.CANCELLED],
                timed_out and done != total,
            )
        time.sleep(interval)
