"""Managers as an operator sees them: who is alive, what a dead one still holds and when
that work is recovered, and the batch allocation each runs in.

Liveness is the leases' one-shot rule. What a manager that is not alive holds is read
from the jobs (an active job's frame names its attempt's manager), never from its last
heartbeat, which says what it ran when it last wrote one.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from httk_flow.errors import FlowError
from httk_flow.protocol.discovery import walk_all
from httk_flow.protocol.durations import compact_duration
from httk_flow.protocol.frames import AttemptRecord, Frame
from httk_flow.protocol.handles import JobHandle
from httk_flow.protocol.jobs import load_spec
from httk_flow.protocol.leases import Liveness, ManagerInfo, read_managers
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

#: seconds after its last heartbeat that a manager which is not alive and holds no job
#: leaves the default listings (`flow managers` without --all, `flow status`)
FORGET_AFTER = 600.0

#: how the work of a manager that is not alive is recovered: at once by the next manager
#: (on this host, or anywhere when it said goodbye), once its lease expires, or only by
#: a manager on its own host (a running job with a persistent workdir)
Recovers = Literal["at_once", "lease_expiry", "its_host"]

#: the states in which a job is held by a manager, in the order they are named
HELD = (State.RUNNING, State.CLAIMED, State.COMMITTING, State.CANCELLING)

START_ONE = "start one with `flow serve` or `flow run`"


def holder(state: State, frame: Frame) -> tuple[str | None, AttemptRecord | None]:
    """The manager holding an active job (as recovery judges it) and its attempt: the
    attempt's manager, or for a commit whoever wrote its committing frame."""
    att = frame.body.attempt
    owner = att.manager if att is not None and att.manager else None
    if state is State.COMMITTING and frame.by:
        owner = frame.by
    return owner, att


@dataclass
class Holding:
    """The active jobs one manager holds, by state, and its running ones."""

    states: Counter[State] = field(default_factory=Counter)
    #: the host its attempts ran on, as their frames say (for a manager with no heartbeat)
    host: str | None = None
    running: list[JobHandle] = field(default_factory=list)

    @property
    def jobs(self) -> int:
        return sum(self.states.values())


def holdings(ws: Workspace) -> dict[str, Holding]:
    """Every active job's holder, read from the job's frame (one frame per active job; a
    frame that cannot be read is fsck's to report)."""
    out: dict[str, Holding] = {}
    for st in HELD:
        for h in walk_all(ws, st):
            try:
                owner, att = holder(st, ws.reader.frame(h.marker.ref))
            except FlowError:
                continue
            if owner is None:
                continue
            one = out.setdefault(owner, Holding())
            one.states[st] += 1
            if one.host is None and att is not None and st is not State.COMMITTING:
                one.host = att.host
            if st is State.RUNNING:
                one.running.append(h)
    return out


def jobs_phrase(states: dict[State, int]) -> str:
    """`1 running job`, `2 claimed jobs`, `3 jobs (2 running, 1 cancelling)`."""
    shown = [(st, states[st]) for st in HELD if states.get(st)]
    n = sum(c for _, c in shown)
    if len(shown) == 1:
        return f"{n} {shown[0][0].value} job{'s' * (n != 1)}"
    return f"{n} jobs ({', '.join(f'{c} {st.value}' for st, c in shown)})"


def clock(t: float, now: float) -> str:
    """A time of day on this host's clock; with the date when it is not today."""
    when, today = dt.datetime.fromtimestamp(t), dt.datetime.fromtimestamp(now)
    return when.strftime("%H:%M:%S" if when.date() == today.date() else "%Y-%m-%d %H:%M")


@dataclass(frozen=True)
class DeadHold:
    """Jobs held by a manager that is not alive, and when a manager recovers them."""

    manager: str
    #: its host (None: unknown) and whether that is this one
    host: str | None
    here: bool
    states: dict[State, int]
    recovers: Recovers
    #: None: it left no heartbeat
    liveness: Liveness | None
    #: its lease, and how long its heartbeat must be silent before others take over
    lease: float
    grace: float
    #: for lease_expiry with a heartbeat: when its lease lets a manager take over
    wait: LeaseWait | None = None

    @property
    def recover_at(self) -> float | None:
        """The earliest takeover (unix time, this host's clock), when it is known."""
        return self.wait.at if self.wait is not None else None

    @property
    def jobs(self) -> int:
        return sum(self.states.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "manager": self.manager,
            "host": self.host,
            "jobs": self.jobs,
            "states": {st.value: n for st, n in self.states.items() if n},
            "recovers": self.recovers,
            "recover_at": round(self.recover_at, 1) if self.recover_at is not None else None,
        }

    def describe(self, now: float) -> str:
        """One line: the jobs, their holder, and when they are recovered."""
        it = "it" if self.jobs == 1 else "them"
        lv = self.liveness
        where = (
            "on this host"
            if self.here
            else f"on host {self.host}"
            if self.host
            else "on an unknown host"
        )
        if lv is None:
            who = f"manager {self.manager} {where}, which left no heartbeat"
        else:
            who = f"{'stopped' if lv.stopped else 'dead'} manager {self.manager} {where}"
        if self.recovers == "at_once":
            by = "the next manager" if lv is not None and lv.stopped else "the next manager here"
            how = f"{by} recovers {it} at once"
        elif self.recovers == "its_host":
            how = (
                f"not recovered on lease expiry (persistent workdir): start a manager on "
                f"{self.host}, or cancel {it}"
            )
        elif lv is None:
            how = (
                f"the next manager recovers {it} once it has missed that heartbeat for "
                f"{compact_duration(self.grace)}"
            )
        elif self.wait is None or self.wait.expires is None:
            how = (
                f"recovered once a running manager has seen its heartbeat unchanged for "
                f"{compact_duration(self.grace)}"
            )
        else:
            w, expires = self.wait, self.wait.expires
            expired = f"its lease expired at {clock(expires, now)}"
            if w.watched is not None and w.watched > now:
                how = (
                    f"recovered once its lease expires in ~{compact_duration(w.watched - now)} "
                    f"(at {clock(w.watched, now)})"
                )
            elif w.watched is not None:
                how = f"{expired}: a running manager recovers {it} now"
            elif expires > now:
                how = (
                    f"recovered once its lease expires in ~{compact_duration(expires - now)} "
                    f"(at {clock(expires, now)}) and a manager has watched that heartbeat for "
                    f"{compact_duration(w.lease)}"
                )
            else:
                how = (
                    f"{expired}: a manager recovers {it} once it has watched that heartbeat "
                    f"for {compact_duration(w.lease)}"
                )
        return f"{jobs_phrase(self.states)} held by {who}; {how}"


@dataclass(frozen=True)
class LeaseWait:
    """When a manager elsewhere is taken over on its lease by the one-shot rule: once the
    lease has expired and the taker has watched its heartbeat for one lease."""

    #: when its lease expires (this host's clock); None: its heartbeat's age is not known
    expires: float | None
    #: the earliest a manager running now can take over (it watches from its start);
    #: None when none runs, or the age is not known
    watched: float | None
    lease: float
    grace: float

    @property
    def at(self) -> float | None:
        """The earliest takeover: by a running manager, else when the lease expires."""
        return self.watched if self.watched is not None else self.expires


def lease_wait(lv: Liveness, factor: float, now: float, live: list[Liveness]) -> LeaseWait:
    """How long the work of `lv` (a manager elsewhere that is not alive) waits for its
    lease, as `live` (the managers running now) would take it over."""
    lease = lv.info.grace_lease
    grace = lease * factor
    expires = now - lv.age + grace if lv.age_known else None
    watched = None
    if expires is not None and live:
        watched = max(expires, min(m.info.started for m in live) + lease)
    return LeaseWait(expires, watched, lease, grace)


def _persistent(ws: Workspace, h: JobHandle) -> bool:
    try:
        return load_spec(ws, h.placement, h.key).workdir == "persistent"
    except FlowError:
        return True  # as recovery takes it


def dead_holds(
    ws: Workspace, held: dict[str, Holding], by_id: dict[str, Liveness], now: float
) -> list[DeadHold]:
    """What the managers that are not alive hold, one entry per way it is recovered."""
    live = [lv for lv in by_id.values() if lv.alive]
    factor = ws.policy.takeover_factor
    out: list[DeadHold] = []
    for mid, hold in sorted(held.items()):
        lv = by_id.get(mid)
        if (lv is not None and lv.alive) or not hold.jobs:
            continue
        lease = lv.info.grace_lease if lv is not None else ws.policy.lease
        host = lv.info.host if lv is not None else hold.host
        states = dict(hold.states)
        base = DeadHold(
            mid, host, host == ws.host, states, "lease_expiry", lv, lease, lease * factor
        )
        if lv is None:
            out.append(base)
        elif lv.stopped or lv.process is not None:
            # it said goodbye, or it ran here and its process is gone: evidence at once
            out.append(replace(base, recovers="at_once"))
        else:
            stuck = 0
            if not ws.policy.persistent_takeover:
                stuck = sum(1 for h in hold.running if _persistent(ws, h))
            if stuck:
                out.append(replace(base, states={State.RUNNING: stuck}, recovers="its_host"))
            rest = {**states, State.RUNNING: states.get(State.RUNNING, 0) - stuck}
            if any(rest.values()):
                wait = lease_wait(lv, factor, now, live)
                out.append(replace(base, states=rest, wait=wait))
    return out


def allocation_of(
    info: ManagerInfo, by_token: dict[str, tuple[str, str]]
) -> tuple[str, str] | None:
    """The batch job a manager runs in, (backend, id): as its heartbeat says, else from
    the record of the allocation `flow scale` submitted it in (by its token)."""
    if info.allocation_id is not None:
        return info.allocation_id
    return by_token.get(info.allocation) if info.allocation else None


def _allocations(ws: Workspace) -> dict[str, tuple[str, str]]:
    # lazy: only read when a manager names an allocation token
    from httk_flow.scale.allocation_records import AllocationStore

    return {r.token: (r.backend, r.handle) for r in AllocationStore(ws).load_all() if r.handle}


@dataclass(frozen=True)
class ManagerView:
    """One manager as the listings show it."""

    liveness: Liveness
    #: the jobs it holds, counted from the jobs; None for a live manager (its heartbeat
    #: says what it runs)
    holds: dict[State, int] | None
    allocation: tuple[str, str] | None

    @property
    def held(self) -> int:
        return sum(self.holds.values()) if self.holds else 0

    @property
    def state(self) -> str:
        """alive, draining, stopped, `dead (holds N jobs)` or `dead (work recovered)`."""
        lv = self.liveness
        if lv.alive:
            return "draining" if lv.info.draining else "alive"
        n = self.held
        holds = f" (holds {n} job{'s' * (n != 1)})" if n else ""
        if lv.stopped:
            return f"stopped{holds}"
        return f"dead{holds or ' (work recovered)'}"

    @property
    def running(self) -> int:
        """Attempts it runs: its heartbeat's while alive, else its running jobs."""
        if self.holds is None:
            return self.liveness.info.running
        return self.holds.get(State.RUNNING, 0)

    @property
    def ends(self) -> float | None:
        """When it ends: its allocation's end, else its usable end (--walltime)."""
        info = self.liveness.info
        return info.allocation_end if info.allocation_end is not None else info.ends_at


@dataclass(frozen=True)
class ManagerLook:
    """Every manager with a heartbeat, and what those that are not alive hold."""

    managers: list[Liveness]
    held: dict[str, Holding]
    dead: list[DeadHold]
    #: this host's clock when it was read
    now: float
    #: allocation tokens to (backend, handle), when a heartbeat names a token only
    tokens: dict[str, tuple[str, str]] = field(default_factory=dict)

    def views(self, *, all_: bool = False) -> list[ManagerView]:
        """The managers the listings show: live ones, dead ones holding jobs or heard from
        within FORGET_AFTER, stopped ones holding jobs; every one with `all_`."""
        out = []
        for lv in self.managers:
            holds = None if lv.alive else dict(self.held.get(lv.info.id, Holding()).states)
            n = sum(holds.values()) if holds else 0
            if all_ or lv.alive or n or (not lv.stopped and lv.age <= FORGET_AFTER):
                out.append(ManagerView(lv, holds, allocation_of(lv.info, self.tokens)))
        return out


def look(ws: Workspace, managers: list[Liveness] | None = None) -> ManagerLook:
    """Managers' liveness (read now unless given) and, when one is not alive or none is,
    the jobs the ones that are not alive hold."""
    managers = read_managers(ws) if managers is None else managers
    now = time.time()
    held: dict[str, Holding] = {}
    by_id = {lv.info.id: lv for lv in managers}
    if not managers or any(not lv.alive for lv in managers):
        held = {
            mid: hold
            for mid, hold in holdings(ws).items()
            if mid not in by_id or not by_id[mid].alive
        }
    tokens = (
        _allocations(ws)
        if any(lv.info.allocation and lv.info.allocation_id is None for lv in managers)
        else {}
    )
    return ManagerLook(managers, held, dead_holds(ws, held, by_id, now), now, tokens)
