"""Manager leases: heartbeat files, the shared filesystem's clock, and the one liveness rule.

No node's clock is trusted that a reader cannot check (docs/protocol.md §8):

* on the reader's own host a manager lives exactly as long as its process (pid and /proc
  start time), whatever its heartbeat says;
* elsewhere a manager is gone when it wrote `stopped`, or when a reader has watched its
  heartbeat stay unchanged for lease × takeover_factor of the reader's own monotonic clock.
  The heartbeat's age in the filesystem's clock (a probe file's creation stamp minus the
  heartbeat's stamp) only shortens that wait for managers that died long before the reader
  looked, and only while the reader's clock agrees with the filesystem's.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from httk_flow.errors import FlowError
from httk_flow.protocol import layout
from httk_flow.protocol.fsio import atomic_write, fs
from httk_flow.protocol.procs import process_alive, this_process
from httk_flow.protocol.resources import Offer
from httk_flow.protocol.services import ServiceClass
from httk_flow.protocol.workspace import MIN_LEASE, Workspace

#: a heartbeat file larger than this is not ours
MAX_HEARTBEAT = 64 * 1024
#: a stamp at most this far ahead of the filesystem's now is taken as now (coarse stamps)
FUTURE_TOLERANCE = 1.0
#: seconds between two measurements of the filesystem clock's offset
CLOCK_EVERY = 5.0
#: a probe whose create took longer than this brackets the filesystem's time too loosely
MAX_PROBE_SPREAD = 1.0

#: what a reader saw that makes a manager gone (recorded in takeover frames)
PROCESS_GONE = "process_gone"
STOPPED = "stopped"
LEASE_EXPIRED = "lease_expired"


def skew_bound(lease: float) -> float:
    """How far a reader's clock may differ from the filesystem's before it stops using
    heartbeat ages: a quarter of the lease, at least 2 s."""
    return max(2.0, lease / 4)


def _float_or_none(v: Any) -> float | None:
    return float(v) if v is not None else None


def parse_allocation_id(v: Any) -> tuple[str, str] | None:
    """(backend, id) from a heartbeat's `allocation_id` or $FLOW_ALLOCATION_ID's
    BACKEND:ID; None for anything else (an old heartbeat has none: it still reads)."""
    backend: Any
    ident: Any
    if isinstance(v, str):
        backend, _, ident = v.partition(":")
    elif isinstance(v, dict):
        backend, ident = v.get("backend"), v.get("id")
    else:
        return None
    if isinstance(backend, str) and isinstance(ident, str) and backend and ident:
        return backend[:64], ident[:128]
    return None


@dataclass(frozen=True)
class ManagerInfo:
    """What a manager publishes about itself in heartbeat.json."""

    id: str
    host: str
    pid: int
    started: float
    pools: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    placements: tuple[str, ...] = ()
    workers: int = 1
    running: int = 0
    draining: bool = False
    #: the usable end (unix time, the manager's clock): it claims only work whose declared
    #: time ends by then; None: no end known
    ends_at: float | None = None
    lease: float = 30.0
    #: /proc start time of the manager process, so a reused pid is not taken for it
    start_time: int = 0
    #: the token of the allocation this manager runs in ("" outside one)
    allocation: str = ""
    #: bumped by every rewrite: a reader sees the heartbeat change even within one mtime tick
    seq: int = 0
    #: when it drains by itself (None: at ends_at, or never)
    drain_at: float | None = None
    #: the end of its allocation as the batch system said (None: not in one, or unknown)
    allocation_end: float | None = None
    #: seconds its allocation keeps back before that end: the drain and the signal margin
    reserve: float | None = None
    #: attempts it started so far
    attempts: int = 0
    #: ready jobs it looked at and left because their declared time would not end by
    #: ends_at, and the longest time one of them declared
    unfit: int = 0
    unfit_need: float | None = None
    #: the batch job it runs in, (backend, id), from its environment; None: not known
    allocation_id: tuple[str, str] | None = None
    #: what it gives its attempts in all, and what of that they hold now (None: a
    #: manager from before resources, which counts only `workers`)
    inventory: Offer | None = None
    in_use: Offer | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def usable_left(self, now: float) -> float | None:
        """Seconds of claimable time left at `now` (0 while draining); None: no end."""
        if self.draining:
            return 0.0
        if self.ends_at is None:
            return None
        return max(0.0, self.ends_at - now)

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "id": self.id,
                "host": self.host,
                "pid": self.pid,
                "started": self.started,
                "pools": list(self.pools),
                "capabilities": list(self.capabilities),
                "placements": list(self.placements),
                "workers": self.workers,
                "running": self.running,
                "draining": self.draining,
                "ends_at": self.ends_at,
                "lease": self.lease,
                "start_time": self.start_time,
                "allocation": self.allocation,
                "seq": self.seq,
                "drain_at": self.drain_at,
                "allocation_end": self.allocation_end,
                "reserve": self.reserve,
                "attempts": self.attempts,
                "unfit": self.unfit,
                "unfit_need": self.unfit_need,
                "allocation_id": (
                    {"backend": self.allocation_id[0], "id": self.allocation_id[1]}
                    if self.allocation_id is not None
                    else None
                ),
                "inventory": self.inventory.to_json() if self.inventory else None,
                "in_use": self.in_use.to_json() if self.in_use else None,
                **self.extra,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> ManagerInfo:
        try:
            d = orjson.loads(raw)
            return cls(
                id=str(d["id"]),
                host=str(d["host"]),
                pid=int(d["pid"]),
                started=float(d["started"]),
                pools=tuple(str(x) for x in d.get("pools", ())),
                capabilities=tuple(str(x) for x in d.get("capabilities", ())),
                placements=tuple(str(x) for x in d.get("placements", ())),
                workers=int(d.get("workers", 1)),
                running=int(d.get("running", 0)),
                draining=bool(d.get("draining", False)),
                ends_at=float(d["ends_at"]) if d.get("ends_at") is not None else None,
                lease=float(d.get("lease", 30.0)),
                start_time=int(d.get("start_time", 0)),
                allocation=str(d.get("allocation", "")),
                seq=int(d.get("seq", 0)),
                drain_at=_float_or_none(d.get("drain_at")),
                allocation_end=_float_or_none(d.get("allocation_end")),
                reserve=_float_or_none(d.get("reserve")),
                attempts=int(d.get("attempts", 0)),
                unfit=int(d.get("unfit", 0)),
                unfit_need=_float_or_none(d.get("unfit_need")),
                allocation_id=parse_allocation_id(d.get("allocation_id")),
                inventory=Offer.from_json(d.get("inventory")),
                in_use=Offer.from_json(d.get("in_use")),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
            raise FlowError(f"is not a valid heartbeat ({e})", obj=where) from None

    def serves(self, pool: str | None, requires: tuple[str, ...]) -> bool:
        """Whether this manager serves jobs of `pool` needing `requires`: the claim pass's
        rule (ServiceClass.served_by), so a heartbeat reader never disagrees with it."""
        return ServiceClass(pool, requires).served_by(self.pools, self.capabilities)

    @property
    def grace_lease(self) -> float:
        """The lease others judge this manager by (an old or planted heartbeat may claim
        one below the floor)."""
        return self.lease if self.lease >= MIN_LEASE else MIN_LEASE


@dataclass(frozen=True)
class Liveness:
    info: ManagerInfo
    age: float  # seconds since the heartbeat last changed, in the filesystem's clock
    alive: bool
    stopped: bool  # the manager said goodbye (clean exit)
    #: the heartbeat's stamps are ahead of the filesystem's now: its age says nothing
    future: bool = False
    #: on the reader's host: whether the manager's process lives (that alone decides)
    process: bool | None = None
    #: why the manager is gone (PROCESS_GONE, STOPPED, LEASE_EXPIRED), when evidence says so
    evidence: str | None = None
    #: whether `age` may be used as evidence (not in the future, the reader's clock sane)
    age_known: bool = True


@dataclass(frozen=True)
class Heartbeat:
    """One read of a manager's heartbeat.json."""

    info: ManagerInfo
    mtime: float
    ctime: float
    #: changes whenever the file is rewritten (or touched): what observation compares
    fingerprint: tuple[int, int, int, int]
    stopped: bool

    def stamp(self, fs_now: float) -> float | None:
        """When the heartbeat last changed, in the filesystem's clock; None if in the future.

        The ctime counts too: a utime() can move the mtime anywhere, but the filesystem
        stamps the ctime itself, so a moved mtime makes a heartbeat neither old nor new."""
        limit = fs_now + FUTURE_TOLERANCE
        stamps = sorted(s for s in (self.mtime, self.ctime) if s > 0)
        for s in reversed(stamps):
            if s <= limit:
                return s
        return None

    @property
    def earliest(self) -> float:
        return min(self.mtime, self.ctime) if self.ctime > 0 else self.mtime


def heartbeat_path(ws: Workspace, manager_id: str) -> str:
    return layout.heartbeat_file(layout.manager_dir(ws.root, manager_id))


def write_heartbeat(ws: Workspace, info: ManagerInfo) -> None:
    """Rewrite the manager's heartbeat; one that does not say which batch job it runs in
    names the one its process's environment does ($FLOW_ALLOCATION_ID)."""
    if info.allocation_id is None:
        found = parse_allocation_id(os.environ.get(layout.ENV_ALLOCATION_ID))
        if found is not None:
            info = replace(info, allocation_id=found)
    d = layout.manager_dir(ws.root, info.id)
    ws.ensure_dir(d)
    try:
        atomic_write(heartbeat_path(ws, info.id), info.to_json(), durable=False)
    except FileNotFoundError:
        # our directory was removed (a mistaken cleanup): a manager must keep heartbeating
        ws.forget_dir(d)
        ws.ensure_dir(d)
        atomic_write(heartbeat_path(ws, info.id), info.to_json(), durable=False)


def mark_stopped(ws: Workspace, manager_id: str) -> None:
    """A clean exit: the manager's lease ends now rather than after its grace."""
    d = layout.manager_dir(ws.root, manager_id)
    try:
        with open(layout.stopped_file(d), "wb"):
            pass
    except OSError:
        pass


def fs_probe(ws: Workspace) -> float | None:
    """The filesystem's time now: the mtime a freshly created file is given, or None.

    Never utime(): a preloaded clock library (or a local clock that is wrong) would stamp
    the probe with the caller's idea of now; a new inode is stamped by the kernel or the
    file server."""
    probe = os.path.join(ws.tmp, f"clock.{ws.host}.{os.getpid()}.{os.urandom(4).hex()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        return os.fstat(fd).st_mtime
    except OSError:
        return None
    finally:
        os.close(fd)
        try:
            os.unlink(probe)
        except OSError:
            pass


def fs_now(ws: Workspace) -> float:
    """The shared filesystem's idea of now (this host's clock if no probe can be made)."""
    stamp = fs_probe(ws)
    return time.time() if stamp is None else stamp


class FsClock:
    """Now in the shared filesystem's clock domain: this host's clock plus a measured
    offset, re-measured with a probe file at most every `every` seconds."""

    def __init__(self, ws: Workspace, *, every: float = CLOCK_EVERY) -> None:
        self.ws = ws
        self.every = every
        #: filesystem minus local clock, seconds
        self.offset = 0.0
        #: whether any probe has succeeded
        self.known = False
        self._at = -1e18

    def measure(self) -> float | None:
        """Probe now: the filesystem's time (None without a probe); updates the offset."""
        self._at = time.monotonic()
        before = time.time()
        stamp = fs_probe(self.ws)
        after = time.time()
        if stamp is None:
            return None
        if after - before <= MAX_PROBE_SPREAD:
            self.offset = stamp - (before + after) / 2
            self.known = True
        return stamp

    def now(self) -> float:
        if time.monotonic() - self._at >= self.every:
            self.measure()
        return time.time() + self.offset

    @property
    def skew(self) -> float:
        """This host's clock minus the filesystem's, seconds."""
        if time.monotonic() - self._at >= self.every:
            self.measure()
        return -self.offset


def scan_heartbeats(ws: Workspace) -> list[Heartbeat]:
    """Every readable heartbeat of the workspace, as it is on disk now."""
    out: list[Heartbeat] = []
    try:
        entries = list(fs.scandir(ws.managers))
    except FileNotFoundError:
        return out
    for e in entries:
        if not e.is_dir(follow_symlinks=False):
            continue
        path = layout.heartbeat_file(e.path)
        try:
            raw = fs.read_bytes(path, MAX_HEARTBEAT)
            st = os.stat(path)
            info = ManagerInfo.from_json(raw, path)
        except (OSError, FlowError):
            continue
        stopped = os.path.lexists(layout.stopped_file(e.path))
        fingerprint = (st.st_ino, st.st_mtime_ns, st.st_size, info.seq)
        out.append(Heartbeat(info, st.st_mtime, st.st_ctime, fingerprint, stopped))
    return out


def judge(
    hb: Heartbeat,
    host: str,
    *,
    fs_now: float,
    use_ages: bool,
    factor: float,
    unchanged_for: float | None = None,
) -> Liveness:
    """The liveness rule. `unchanged_for`: how long this reader has watched the heartbeat
    stay the same on its monotonic clock (None for a one-shot read, which has only ages)."""
    info = hb.info
    lease = info.grace_lease
    grace = lease * factor
    stamp = hb.stamp(fs_now)
    # a heartbeat from the future is shown as such: a negative age
    age = max(0.0, fs_now - stamp) if stamp is not None else fs_now - hb.earliest
    aged = use_ages and stamp is not None
    if info.host == host and not this_process(info.pid, info.start_time):
        # "stopped" with the process still there: it is finishing its exit
        up = process_alive(info.pid, info.start_time)
        return Liveness(
            info,
            age,
            alive=up,
            stopped=hb.stopped,
            future=stamp is None,
            process=up,
            evidence=None if up else PROCESS_GONE,
            age_known=aged,
        )
    evidence: str | None = None
    if hb.stopped:
        evidence = STOPPED
    elif unchanged_for is None:
        if aged and age > grace:
            evidence = LEASE_EXPIRED
    elif unchanged_for >= grace or (unchanged_for >= lease and aged and age > grace):
        evidence = LEASE_EXPIRED
    if evidence is not None:
        alive = False
    elif unchanged_for is None:
        alive = not aged or age <= lease
    else:
        alive = unchanged_for < lease
    return Liveness(
        info,
        age,
        alive=alive,
        stopped=hb.stopped,
        future=stamp is None,
        evidence=evidence,
        age_known=aged,
    )


def read_managers(ws: Workspace, *, now: float | None = None) -> list[Liveness]:
    """Every manager that ever heartbeated here, with liveness as one read can tell it.

    `now` (the filesystem's time) is measured with a probe unless given; ages are used
    only while this host's clock agrees with the filesystem's."""
    if now is None:
        clock = FsClock(ws)
        probed = clock.measure()
        fs_time = time.time() if probed is None else probed
        use_ages = clock.known and abs(clock.skew) <= skew_bound(ws.policy.lease)
    else:
        fs_time, use_ages = now, True
    factor = ws.policy.takeover_factor
    out = [
        judge(hb, ws.host, fs_now=fs_time, use_ages=use_ages, factor=factor)
        for hb in scan_heartbeats(ws)
    ]
    out.sort(key=lambda lv: (not lv.alive, lv.info.started))
    return out


def silent_for_takeover(lv: Liveness, factor: float) -> bool:
    """Evidence of a one-shot read that the manager is gone: on this host its process is;
    elsewhere it said goodbye, or its known age is past the takeover grace."""
    if lv.process is not None:
        return not lv.process
    if lv.stopped:
        return True
    return lv.age_known and lv.age > lv.info.grace_lease * factor
