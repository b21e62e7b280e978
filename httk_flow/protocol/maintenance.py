"""The maintenance lock: while it is held, managers launch nothing new."""

from __future__ import annotations

import getpass
import os
import time
from dataclasses import dataclass

import orjson

from httk_flow.errors import FlowError, UsageError
from httk_flow.protocol import layout
from httk_flow.protocol.durations import format_duration
from httk_flow.protocol.fsio import atomic_write, fs
from httk_flow.protocol.workspace import Workspace

#: a lock older than this is reported as stale (still obeyed until someone unlocks)
STALE_AFTER = 24 * 3600.0


@dataclass(frozen=True)
class MaintenanceLock:
    reason: str
    user: str
    host: str
    since: float

    @property
    def stale(self) -> bool:
        return time.time() - self.since > STALE_AFTER

    def describe(self, now: float | None = None) -> str:
        """Who holds it, for how long (as of `now`; default: this moment), and why."""
        if self.since > 0:
            age = max(0.0, (time.time() if now is None else now) - self.since)
            text = f"by {self.user}@{self.host}, {format_duration(age)} ago"
        else:
            text = f"by {self.user}@{self.host}, since an unknown time"
        if self.reason:
            text += f": {self.reason}"
        return text + (" — stale, check whether it is still needed" if self.stale else "")


def lock_path(ws: Workspace) -> str:
    return layout.maintenance_file(ws.root)


def read_lock(ws: Workspace) -> MaintenanceLock | None:
    try:
        d = orjson.loads(fs.read_bytes(lock_path(ws), 65536))
        return MaintenanceLock(
            str(d.get("reason", "")),
            str(d.get("user", "?")),
            str(d.get("host", "?")),
            float(d.get("since", 0.0)),
        )
    except FileNotFoundError:
        return None
    except (OSError, FlowError, orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
        # an unreadable lock is still a lock: refusing to launch is the safe reading
        return MaintenanceLock("unreadable lock file", "?", "?", 0.0)


def acquire(ws: Workspace, reason: str) -> MaintenanceLock:
    existing = read_lock(ws)
    if existing is not None:
        raise UsageError(
            f"is already held ({existing.describe()})",
            obj="the maintenance lock",
            hint="release it with `flow unlock` first",
        )
    lock = MaintenanceLock(reason, getpass.getuser(), ws.host, time.time())
    data = orjson.dumps(
        {"reason": lock.reason, "user": lock.user, "host": lock.host, "since": lock.since}
    )
    atomic_write(lock_path(ws), data, durable=ws.policy.durable)
    return lock


def release(ws: Workspace) -> bool:
    try:
        os.unlink(lock_path(ws))
        return True
    except FileNotFoundError:
        return False
