"""Allocation records on disk: one JSON file per allocation, the pause flag, and the
lease that lets only one reconciler act on a workspace at a time."""

from __future__ import annotations

import enum
import os
import time
from dataclasses import asdict, dataclass

import orjson

from httk_flow.errors import FlowError
from httk_flow.protocol import layout
from httk_flow.protocol.durations import compact_duration
from httk_flow.protocol.fsio import atomic_write, fs
from httk_flow.protocol.workspace import Workspace
from httk_flow.scale.backends.base import AllocationProfile

#: when the queue was last unpaused: failures before it do not count again
UNPAUSED = layout.ALLOC_UNPAUSED


class AllocPhase(enum.Enum):
    REQUESTED = "requested"  # record written, submission not (known to be) made
    UNKNOWN = "unknown"  # submitted with no definite answer: ask by token next
    PENDING = "pending"
    RUNNING = "running"
    CANCELLING = "cancelling"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def active(self) -> bool:
        return self in (
            AllocPhase.REQUESTED,
            AllocPhase.UNKNOWN,
            AllocPhase.PENDING,
            AllocPhase.RUNNING,
        )

    @property
    def ended(self) -> bool:
        return self in (AllocPhase.DONE, AllocPhase.FAILED, AllocPhase.CANCELLED)


@dataclass(frozen=True)
class AllocationRecord:
    token: str
    backend: str
    phase: AllocPhase
    created: float
    updated: float
    handle: str | None = None
    reason: str = ""
    ran: bool = False  # it was seen running at least once
    #: the walltime it was submitted with (seconds; None: the backend's default)
    time: float | None = None
    #: attempts its manager started, as its heartbeat last said
    attempts: int = 0
    #: the service class it was asked for (None: recorded by an older release, unshaped)
    service: str | None = None
    #: the shape it was asked for (None: the backend's defaults)
    profile: AllocationProfile | None = None

    def to_json(self) -> bytes:
        d = asdict(self)
        d["phase"] = self.phase.value
        d["profile"] = self.profile.to_json() if self.profile is not None else None
        return orjson.dumps(d)

    @property
    def shape(self) -> str:
        """The profile in words (`1×2 CPUs, 1G`); `-` when it has none."""
        return self.profile.describe() if self.profile is not None else "-"

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> AllocationRecord:
        try:
            d = orjson.loads(raw)
            return cls(
                str(d["token"]),
                str(d["backend"]),
                AllocPhase(d["phase"]),
                float(d["created"]),
                float(d["updated"]),
                d.get("handle"),
                str(d.get("reason", "")),
                bool(d.get("ran", False)),
                float(d["time"]) if d.get("time") is not None else None,
                int(d.get("attempts", 0)),
                str(d["service"]) if d.get("service") is not None else None,
                AllocationProfile.from_json(d.get("profile")),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise FlowError(f"is not an allocation record ({e})", obj=where) from None


class AllocationStore:
    """`.flow/allocations/<token>.json`, one record per allocation."""

    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self.dir = layout.allocations_dir(ws.root)
        self._paused = layout.allocations_paused(ws.root)
        self._unpaused = layout.allocations_unpaused(ws.root)

    def path(self, token: str) -> str:
        return layout.allocation_file(self.ws.root, token)

    def save(self, rec: AllocationRecord) -> None:
        os.makedirs(self.dir, exist_ok=True)
        atomic_write(self.path(rec.token), rec.to_json(), durable=True)

    def load_all(self) -> list[AllocationRecord]:
        out: list[AllocationRecord] = []
        try:
            entries = list(fs.scandir(self.dir))
        except FileNotFoundError:
            return out
        for e in entries:
            if not e.name.endswith(".json") or not e.is_file(follow_symlinks=False):
                continue
            if e.name in (layout.ALLOC_PAUSED, UNPAUSED):
                continue
            try:
                out.append(AllocationRecord.from_json(fs.read_bytes(e.path, 65536), e.path))
            except (OSError, FlowError):
                continue
        out.sort(key=lambda r: r.created)
        return out

    def paused(self) -> str | None:
        try:
            return str(orjson.loads(fs.read_bytes(self._paused, 65536)).get("reason", "paused"))
        except FileNotFoundError:
            return None
        except (OSError, FlowError, orjson.JSONDecodeError, AttributeError):
            return "paused (unreadable reason)"

    def pause(self, reason: str) -> None:
        os.makedirs(self.dir, exist_ok=True)
        atomic_write(
            self._paused,
            orjson.dumps({"reason": reason, "since": time.time()}),
            durable=True,
        )

    def unpause(self) -> bool:
        # failures before this moment no longer count towards a new pause
        os.makedirs(self.dir, exist_ok=True)
        atomic_write(self._unpaused, orjson.dumps({"since": time.time()}), durable=True)
        try:
            os.unlink(self._paused)
            return True
        except FileNotFoundError:
            return False

    def unpaused_at(self) -> float:
        """When the queue was last unpaused (0 if never)."""
        try:
            return float(orjson.loads(fs.read_bytes(self._unpaused, 4096))["since"])
        except (OSError, FlowError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return 0.0  # never unpaused (or unreadable): every failure counts


#: a lease that records its holder's loop interval is stale when not renewed for three
#: of those intervals and this much more (a pass may be slow: a backend that answers late)
LEASE_MARGIN = 30.0


def lease_ttl(interval: float) -> float:
    """How long a lease held by a reconciler looping every `interval` stays valid."""
    return 3 * interval + LEASE_MARGIN


def legacy_ttl(interval: float) -> float:
    """The rule for a lease that records no interval: the reader's own (older releases)."""
    return max(30.0, 3 * interval)


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds the reconciler lease, as its file says."""

    owner: str | None
    pid: int | None
    host: str
    #: when it first took the lease (None: not recorded)
    since: float | None
    #: when it last renewed the lease (the file's modification time)
    renewed: float
    #: its loop interval (None: not recorded, a lease of an older release)
    interval: float | None
    #: how long after `renewed` the lease is stale
    ttl: float

    @property
    def stale_at(self) -> float:
        return self.renewed + self.ttl

    def describe(self, now: float) -> str:
        """Who, since when, and when the lease would be taken for stale."""
        who = f"pid {self.pid}" if self.pid is not None else "an unknown process"
        if self.host:
            who += f" on {self.host}"
        if self.interval is not None:
            who += f", looping every {compact_duration(self.interval)}"
        if self.since is not None:
            who += f" since {_when(self.since)}"
        ago = compact_duration(max(0.0, now - self.renewed))
        if self.interval is not None:
            rule = f"3 × its interval + {compact_duration(LEASE_MARGIN)}"
        else:
            rule = "it records no interval: 3 × this command's --interval, at least 30s"
        return (
            f"{who}, last renewed {ago} ago; stale if not renewed by "
            f"{_when(self.stale_at)} ({rule})"
        )


class ReconcilerLease:
    """Only one reconciler acts on a workspace: a lease file renewed every pass.

    The file records the holder's loop interval, so that any reader judges the holder by
    the holder's cadence (`lease_ttl`), not by its own; a file without one (written by an
    older release) is judged by the reader's interval, as before (`legacy_ttl`)."""

    def __init__(self, ws: Workspace, owner: str, interval: float) -> None:
        self.path = layout.reconciler_lease(ws.root)
        self.owner = owner
        self.interval = interval
        self.host = ws.host
        #: when this owner first took the lease
        self.since: float | None = None
        #: the holder found by the last acquire that was refused
        self.holder: LeaseHolder | None = None

    def _record(self, now: float) -> bytes:
        return orjson.dumps(
            {
                "owner": self.owner,
                "pid": os.getpid(),
                "host": self.host,
                "t": now,
                "since": self.since if self.since is not None else now,
                "interval": self.interval,
            }
        )

    def read(self) -> LeaseHolder | None:
        """The holder as the lease file says (None: no lease); an unreadable file is
        a holder of nothing, stale at once."""
        try:
            raw = fs.read_bytes(self.path, 4096)
            renewed = os.stat(self.path).st_mtime
        except FileNotFoundError:
            return None
        except (OSError, FlowError):
            return LeaseHolder(None, None, "", None, 0.0, None, 0.0)  # stale at once
        try:
            d = orjson.loads(raw)
            owner = d.get("owner")
            interval = _number(d.get("interval"))
            pid = d.get("pid")
            return LeaseHolder(
                str(owner) if owner is not None else None,
                int(pid) if isinstance(pid, int) else None,
                str(d.get("host") or ""),
                _number(d.get("since")),
                renewed,
                interval,
                lease_ttl(interval) if interval is not None else legacy_ttl(self.interval),
            )
        except (orjson.JSONDecodeError, AttributeError):
            # not a record: judged by its age alone, as a lease that records nothing
            return LeaseHolder(None, None, "", None, renewed, None, legacy_ttl(self.interval))

    def acquire(self) -> bool:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        now = time.time()
        data = self._record(now)
        try:
            # a reader that comes before the write sees no record: it judges the file by
            # its age (read), so a lease being created is never taken for stale
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            self.since = self.since if self.since is not None else now
            return True
        except FileExistsError:
            pass
        holder = self.read()
        if holder is None:
            return self.acquire()  # released meanwhile
        if holder.owner == self.owner:
            atomic_write(self.path, data, durable=False)
            return True
        if time.time() <= holder.stale_at:
            self.holder = holder
            return False
        # a stale lease: whoever renames it away first takes over
        stale = f"{self.path}.{self.owner}"
        try:
            os.rename(self.path, stale)
        except FileNotFoundError:
            return False
        os.unlink(stale)
        return self.acquire()

    def release(self) -> None:
        try:
            raw = fs.read_bytes(self.path, 4096)
            if orjson.loads(raw).get("owner") == self.owner:
                os.unlink(self.path)
        except (OSError, FlowError, orjson.JSONDecodeError, AttributeError):
            pass


def _number(v: object) -> float | None:
    """A positive number from a record, or None."""
    if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
        return None
    return float(v)
