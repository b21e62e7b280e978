"""Shared helpers for the test suite: waiting without bare sleeps, making jobs fast, a
manager in this process, reading an attempt's outcome, and reading the processes of this
host (the one /proc reader of the tests)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from httk_flow.manager.config import ManagerConfig
from httk_flow.manager.loop import Manager
from httk_flow.protocol.layout import (
    OUTCOME_AGAIN,
    OUTCOME_DIR,
    OUTCOME_FILE,
    OUTCOME_LINE,
    duplicate_file,
)
from httk_flow.protocol.names import Marker, RecordRef, new_id
from httk_flow.protocol.outcome import Action, JoinMode, Outcome, read_outcome
from httk_flow.protocol.procs import _stat_fields
from httk_flow.protocol.states import State, ends_commit
from httk_flow.protocol.transition import JobHandle
from httk_flow.protocol.workspace import Workspace

#: every state kind's name in the protocol's order (the order of `flow status --json`'s
#: counts), spelled out so that a state renamed, added or moved fails the tests naming them
STATE_NAMES = [
    "submitted",
    "ready",
    "claimed",
    "running",
    "committing",
    "waiting",
    "paused",
    "cancelling",
    "succeeded",
    "failed",
    "cancelled",
]


def ends_a_commit(frame: dict[str, Any]) -> bool:
    """Whether a frame as the journal holds it ends an attempt's commit (committing -> X,
    X not committing, or the direct running -> succeeded)."""
    src, to = frame.get("from"), frame.get("to")
    if not isinstance(src, str) or not isinstance(to, str):
        return False
    return ends_commit(State(src), State(to))


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.01) -> object:
    """Poll `predicate` until it returns something truthy; fail the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout} s: {predicate!r}")
        time.sleep(interval)


#: how many managers run inside this (the test) process: while one does, the orphan
#: reapers (manager/support.py) reap nothing, for the manager's attempts are this
#: process's own children and their exit statuses are the manager's to collect
IN_PROCESS_MANAGERS = [0]
#: held by a reaper for a whole round of reaping, so that no round that began before a
#: manager started can reap that manager's attempts
REAP_LOCK = threading.Lock()


@contextlib.contextmanager
def manager_in_this_process() -> Iterator[None]:
    with REAP_LOCK:
        IN_PROCESS_MANAGERS[0] += 1
    try:
        yield
    finally:
        with REAP_LOCK:
            IN_PROCESS_MANAGERS[0] -= 1


def serve_in_process(ws: Workspace, *, idle: float = 0.0) -> tuple[Manager, int]:
    """Run a manager (two workers, quiet) in this process on `ws` until it has been idle for
    `idle` s; one that is not idle within a minute is stopped, and fails the test. The
    manager, and its exit status."""
    manager = Manager(
        ws, ManagerConfig(workers=2, exit_when_idle=idle, poll_interval=0.05, verbose=False)
    )
    watchdog = threading.Timer(60, lambda: setattr(manager.drain, "exit_now", True))
    watchdog.start()
    try:
        with manager_in_this_process():
            rc = manager.run(install_signals=False)
    finally:
        watchdog.cancel()
    assert not manager.drain.exit_now, "the manager did not become idle within a minute"
    return manager, rc


def plant_marker(
    ws: Workspace,
    state: State,
    placement: str,
    *,
    key: str | None = None,
    priority: int = 500,
    generation: int = 0,
    ref: RecordRef | None = None,
) -> JobHandle:
    """Create a bare marker file (no payload, no frame) for discovery-only tests."""
    marker = Marker(
        key=key or new_id(),
        priority=priority,
        generation=generation,
        ref=ref or RecordRef("w0", 0, 0),
    )
    handle = JobHandle(state, placement, marker)
    path = handle.path(ws)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "xb"):
        pass
    return handle


def waiting_outcome(attempt: Path, step: str, join: JoinMode, on_impossible: str | None) -> Outcome:
    """The outcome the attempt (its control directory) published, which must be a wait at
    `step` on a `join` join of its children, going on at `on_impossible` if that cannot be
    met."""
    out = read_outcome(str(attempt))
    assert out is not None
    assert (out.action, out.step, out.join, out.on_impossible) == (
        Action.WAIT,
        step,
        join,
        on_impossible,
    )
    return out


def published_outcome(attempt: str | os.PathLike[str]) -> dict[str, object]:
    """The JSON object an attempt published, in whichever form it took: outcome.line
    (written in place: it must be whole, one line ending in its newline) or
    outcome.ready/outcome.json (renamed into place). Exactly one form must be there."""
    line, ready = Path(attempt) / OUTCOME_LINE, Path(attempt) / OUTCOME_DIR
    forms = [p.name for p in (line, ready) if os.path.lexists(p)]
    assert len(forms) == 1, f"{attempt}: expected one published outcome, found {forms}"
    if forms == [OUTCOME_LINE]:
        raw = line.read_bytes()
        assert raw.endswith(b"\n") and raw.count(b"\n") == 1, f"{line} is not one line: {raw!r}"
    else:
        raw = (ready / OUTCOME_FILE).read_bytes()
    data = orjson.loads(raw)
    assert isinstance(data, dict), raw
    return data


def duplicate_note(attempt: str | os.PathLike[str]) -> str | None:
    """What a second publication said beside the first (outcome.duplicate beside
    outcome.line, or outcome.ready/duplicate), or None when there was none."""
    notes = (OUTCOME_AGAIN, duplicate_file(OUTCOME_DIR))
    for p in (Path(attempt) / n for n in notes):
        if p.exists():
            return p.read_text()
    return None


def record_listdir(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every directory os.listdir lists from now on, in order (each still listed)."""
    listed: list[str] = []
    real = os.listdir

    def listdir(path: str) -> list[str]:
        listed.append(path)
        return real(path)

    monkeypatch.setattr(os, "listdir", listdir)
    return listed


def markers_in(ws: Workspace, state: State) -> list[str]:
    """Relative paths of every file under one state kind (a plain os.walk, for assertions)."""
    root = ws.state_dir(state)
    out: list[str] = []
    for d, _, files in os.walk(root):
        out.extend(os.path.relpath(os.path.join(d, f), root) for f in files)
    return out


@contextlib.contextmanager
def small_tmpfs(mnt: Path, options: str) -> Iterator[Path]:
    """A tmpfs of our own at `mnt` (root may mount one), unmounted afterwards. Where none
    can be mounted the test is skipped, except in CI, where it fails: CI runs as root."""
    mnt.mkdir(parents=True, exist_ok=True)
    try:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)],
            capture_output=True,
            text=True,
        )
        why = (r.stderr.strip() or f"exit status {r.returncode}") if r.returncode else ""
    except OSError as e:
        why = str(e)
    if why:
        message = f"cannot mount a tmpfs here ({why})"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill_disk(directory: Path, block: int = 65536) -> Path:
    """Take every free block of the filesystem into one file, which is returned."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for size in (block, 512):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    return filler


# -- processes of this host -------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    """What the tests read of one process's /proc/<pid>/stat."""

    pid: int
    state: str  # "R", "S", "Z", ...
    ppid: int
    pgid: int


def proc_pids() -> list[int]:
    """Pids of every process of this host (some may be gone by the time they are read)."""
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def proc(pid: int) -> Proc | None:
    """The process's stat (the package's own parser), or None when it is gone."""
    fields = _stat_fields(pid)
    try:
        return Proc(pid, fields[0].decode(), int(fields[1]), int(fields[2])) if fields else None
    except (IndexError, ValueError):
        return None


def processes() -> Iterator[Proc]:
    """Every process of this host that still exists when its stat is read."""
    for pid in proc_pids():
        p = proc(pid)
        if p is not None:
            yield p


def processes_with_env(entry: str) -> list[int]:
    """Pids of the processes whose environment holds `entry` ("NAME=value") exactly."""
    needle = f"{entry}\0".encode()
    out = []
    for pid in proc_pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if needle in env:
            out.append(pid)
    return out


def attempt_output(job_dir: str | os.PathLike[str], n: int, name: str = "stdout") -> str:
    """What attempt n wrote to `name` (stdout, stderr): in its directory while it runs, or
    beside job.json (aNNNN.stdout) once its commit tidied it; "" when it wrote nothing."""
    for path in (
        Path(job_dir) / f"a{n:04d}" / name,
        Path(job_dir) / "attempts" / f"a{n:04d}" / name,  # made by protocol revision <= 5
        Path(job_dir) / f"a{n:04d}.{name}",
    ):
        try:
            return path.read_text(errors="replace")
        except FileNotFoundError:
            continue
    return ""


#: the start of a racer script for run_racers: its workspace, a MarkerStream of one state
#: kind (format with state=State member name), and the wait for the start signal
RACER_PRELUDE = """
import json, os, sys, time
from httk_flow.protocol.discovery import MarkerStream
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

root, me, signals = sys.argv[1], sys.argv[2], sys.argv[3]
ws = Workspace.open(root)
stream = MarkerStream(ws, State.{state})
open(os.path.join(signals, "ready-" + me), "w").close()
while not os.path.exists(os.path.join(signals, "go")):
    time.sleep(0.001)  # polls for the start signal
"""


def run_racers(script: str, root: str, n: int, signals: Path, timeout: float) -> dict[str, Any]:
    """Start n Python processes on `script` (argv: root, racerI, signals dir), each
    touching ready-racerI in `signals` when set; then release them all at once with
    signals/go and return what each printed as JSON, by racer name."""
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", script, root, f"racer{i}", str(signals)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(n)
    ]
    try:
        wait_for(lambda: len(os.listdir(signals)) == n, timeout=30)
        (signals / "go").touch()
        results = {}
        for i, proc in enumerate(racers):
            out, err = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, err.decode()
            results[f"racer{i}"] = json.loads(out)
        return results
    finally:
        for proc in racers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
