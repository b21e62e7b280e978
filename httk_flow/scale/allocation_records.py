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
from httk_flow.protocol.fsio import atomic_write, fs
from httk_flow.protocol.workspace import Workspace

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

    def to_json(self) -> bytes:
        d = asdict(self)
        d["phase"] = self.phase.value
        return orjson.dumps(d)

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


class ReconcilerLease:
    """Only one reconciler acts on a workspace: a lease file renewed every tick."""

    def __init__(self, ws: Workspace, owner: str, ttl: float) -> None:
        self.path = layout.reconciler_lease(ws.root)
        self.owner = owner
        self.ttl = ttl

    def acquire(self) -> bool:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        data = orjson.dumps({"owner": self.owner, "pid": os.getpid(), "t": time.time()})
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            return True
        except FileExistsError:
            pass
        try:
            raw = fs.read_bytes(self.path, 4096)
            holder = orjson.loads(raw).get("owner")
            age = time.time() - os.stat(self.path).st_mtime
        except (OSError, FlowError, orjson.JSONDecodeError, AttributeError):
            holder, age = None, self.ttl + 1
        if holder == self.owner:
            atomic_write(self.path, data, durable=False)
            return True
        if age <= self.ttl:
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
