"""Which GPUs and pinned CPUs of this node are held, by whom: a node-local ledger.

A manager killed with `kill -9` leaves its attempts running until the next manager
recovers them; a manager restarted beside them must not hand their GPUs to new work in
the meantime, and two managers started on one node with the same devices must not share
them. So every GPU or pinned CPU an attempt holds is written here, under a lock, with the
process group holding it; an entry whose holder is gone is free again.

Only attempts that hold GPUs or pinned CPUs touch the ledger: the hot path of plain jobs
never does.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator, Sequence

import orjson

from httk_flow.manager.launcher import group_alive
from httk_flow.protocol import layout
from httk_flow.protocol.procs import proc_start_time, process_alive

#: the ledger's directory unless the environment names one (node-local storage)
LEDGER_DIR_ENV = layout.ENV_DEVICE_LEDGER


def default_dir() -> str:
    base = os.environ.get(LEDGER_DIR_ENV)
    if base:
        return base
    shm = "/dev/shm"
    root = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()
    return os.path.join(root, f"httk-flow-{os.getuid()}")


class DeviceLedger:
    """devices.json beside devices.lock: {"gpu:0": {"pid", "start", "pgid"?}, ...}."""

    def __init__(self, directory: str | None = None) -> None:
        self.dir = directory or default_dir()
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        self.path = os.path.join(self.dir, "devices.json")
        self.lock_path = os.path.join(self.dir, "devices.lock")
        self.pid = os.getpid()
        self.start = proc_start_time(self.pid) or 0

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, dict[str, int]]]:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            entries = self._read()
            before = dict(entries)
            yield entries
            if entries != before:
                self._write(entries)
        finally:
            os.close(fd)  # closing releases the lock

    def _read(self) -> dict[str, dict[str, int]]:
        try:
            with open(self.path, "rb") as fh:
                data = orjson.loads(fh.read())
        except (OSError, orjson.JSONDecodeError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {k: v for k, v in data.items() if isinstance(v, dict)}

    def _write(self, entries: dict[str, dict[str, int]]) -> None:
        tmp = f"{self.path}.{self.pid}"
        with open(tmp, "wb") as fh:
            fh.write(orjson.dumps(entries))
        os.replace(tmp, self.path)  # whole or not at all, even if we die here

    @staticmethod
    def _alive(e: dict[str, int]) -> bool:
        pgid = e.get("pgid")
        if isinstance(pgid, int) and pgid > 0:
            return group_alive(pgid)
        pid = e.get("pid")
        return isinstance(pid, int) and process_alive(pid, e.get("start") or None)

    def _prune(self, entries: dict[str, dict[str, int]]) -> None:
        for k in [k for k, e in entries.items() if not self._alive(e)]:
            del entries[k]

    def acquire(self, kind: str, want: int, candidates: Sequence[str]) -> list[str] | None:
        """`want` of `candidates` (ids of `kind`) that nobody holds, now held by this
        process; None when fewer are free."""
        if want <= 0:
            return []
        with self._locked() as entries:
            self._prune(entries)
            free = [c for c in candidates if f"{kind}:{c}" not in entries]
            if len(free) < want:
                return None
            chosen = free[:want]
            for c in chosen:
                entries[f"{kind}:{c}"] = {"pid": self.pid, "start": self.start}
            return chosen

    def attach(self, keys: Sequence[str], pgid: int) -> None:
        """The attempt's process group now holds these (it outlives a killed manager)."""
        if not keys:
            return
        with self._locked() as entries:
            for k in keys:
                e = entries.get(k)
                if e is not None and e.get("pid") == self.pid:
                    entries[k] = {**e, "pgid": pgid}

    def release(self, keys: Sequence[str]) -> None:
        if not keys:
            return
        with self._locked() as entries:
            for k in keys:
                e = entries.get(k)
                if e is not None and e.get("pid") == self.pid:
                    del entries[k]
