"""Manager leases: heartbeat files, and liveness decided on read in the filesystem's clock.

A heartbeat's age is the mtime of a probe file the reader has just touched minus the
heartbeat's mtime: both stamps come from the same (shared) filesystem, so clock skew
between nodes cannot make a live manager look dead.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from httk_flow.errors import FlowError
from httk_flow.fsio import atomic_write, fs
from httk_flow.procs import process_alive
from httk_flow.workspace import Workspace

#: a heartbeat file larger than this is not ours
MAX_HEARTBEAT = 64 * 1024


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
    ends_at: float | None = None
    lease: float = 30.0
    #: /proc start time of the manager process, so a reused pid is not taken for it
    start_time: int = 0
    #: the token of the allocation this manager runs in ("" outside one)
    allocation: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

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
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
            raise FlowError(f"is not a valid heartbeat ({e})", obj=where) from None

    def serves(self, pool: str | None, requires: tuple[str, ...]) -> bool:
        pool_ok = (pool in self.pools) if pool else (not self.pools or "default" in self.pools)
        return pool_ok and set(requires) <= set(self.capabilities)


@dataclass(frozen=True)
class Liveness:
    info: ManagerInfo
    age: float  # seconds since the last heartbeat, in the filesystem's clock
    alive: bool
    stopped: bool  # the manager said goodbye (clean exit)


def heartbeat_path(ws: Workspace, manager_id: str) -> str:
    return os.path.join(ws.managers, manager_id, "heartbeat.json")


def write_heartbeat(ws: Workspace, info: ManagerInfo) -> None:
    d = os.path.join(ws.managers, info.id)
    ws.ensure_dir(d)
    atomic_write(heartbeat_path(ws, info.id), info.to_json(), durable=False)


def mark_stopped(ws: Workspace, manager_id: str) -> None:
    """A clean exit: the manager's lease ends now rather than after its grace."""
    d = os.path.join(ws.managers, manager_id)
    try:
        with open(os.path.join(d, "stopped"), "wb"):
            pass
    except OSError:
        pass


def fs_now(ws: Workspace) -> float:
    """The shared filesystem's idea of now: the mtime of a probe file touched just now."""
    probe = os.path.join(ws.tmp, f"clock.{ws.host}.{os.getpid()}")
    try:
        with open(probe, "wb"):
            pass
        os.utime(probe, None)
        stamp = os.stat(probe).st_mtime
        os.unlink(probe)
        return stamp
    except OSError:
        return time.time()


def read_managers(ws: Workspace, *, now: float | None = None) -> list[Liveness]:
    """Every manager that ever heartbeated here, with liveness decided now."""
    now = fs_now(ws) if now is None else now
    out: list[Liveness] = []
    try:
        entries = list(fs.scandir(ws.managers))
    except FileNotFoundError:
        return out
    for e in entries:
        if not e.is_dir(follow_symlinks=False):
            continue
        path = os.path.join(e.path, "heartbeat.json")
        try:
            raw = fs.read_bytes(path, MAX_HEARTBEAT)
            mtime = os.stat(path).st_mtime
            info = ManagerInfo.from_json(raw, path)
        except (OSError, FlowError):
            continue
        stopped = os.path.lexists(os.path.join(e.path, "stopped"))
        age = max(0.0, now - mtime)
        alive = not stopped and age <= info.lease
        if alive and info.host == ws.host and not process_alive(info.pid, info.start_time):
            alive = False  # on this host we can see the process is gone: better evidence
        out.append(Liveness(info, age, alive=alive, stopped=stopped))
    out.sort(key=lambda lv: (not lv.alive, lv.info.started))
    return out


def silent_for_takeover(lv: Liveness, factor: float) -> bool:
    """Lease evidence: the owner said goodbye, or was silent past the takeover grace."""
    return lv.stopped or lv.age > lv.info.lease * factor
