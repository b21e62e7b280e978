"""Helpers of the operator tests: `flow` in-process on one workspace, job scripts, processes.

Commands whose effect is immediate run in-process through click's CliRunner (plain mode,
colour off); managers and anything that must run beside them are real processes, started
through tests/manager/support.py's Managers (with its OrphanReaper as the subreaper).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest
from click.testing import CliRunner, Result
from helpers import processes, wait_for
from manager.support import ManagerProcess, Managers, log_of, write_program

from httk_flow.cli.main import cli
from httk_flow.protocol.discovery import MarkerStream
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

FLOW = [sys.executable, "-m", "httk_flow"]

T = TypeVar("T")

#: a two-step bash runner: `main` waits for $FLOW_WORKDIR/release, then advances to `two`
ADVANCE_ON_RELEASE = """#!/usr/bin/env bash
source "$FLOW_BASH_API"
flow_steps main two
step_main() {
    touch "$FLOW_WORKDIR/started"
    until [ -e "$FLOW_WORKDIR/release" ]; do sleep 0.05; done
    flow_advance two "main done"
}
step_two() { flow_succeed "two done"; }
flow_main "$@"
"""

#: fails in `main` for good; `fix` succeeds
BROKEN_MAIN = """#!/usr/bin/env bash
source "$FLOW_BASH_API"
flow_steps main fix
step_main() { flow_fail "main is broken" broken; }
step_fix() { flow_succeed "fixed"; }
flow_main "$@"
"""

#: counts its attempts in the persistent workdir; attempts before $FLOW_PARAM_ok fail
SUCCEEDS_AT = """#!/bin/sh
n=$(cat "$FLOW_WORKDIR/count" 2>/dev/null || echo 0)
n=$((n + 1))
echo "$n" > "$FLOW_WORKDIR/count"
echo "out $n"
echo "err $n" >&2
[ "$n" -ge "${FLOW_PARAM_ok:-1}" ] || exit 1
if [ -n "${FLOW_PARAM_block:-}" ]; then
    touch "$FLOW_WORKDIR/started"
    until [ -e "$FLOW_WORKDIR/release" ]; do sleep 0.05; done
fi
"""


#: write_script(directory, name, body): an executable job script (its own #! line) in
#: `directory`, its path
write_script = write_program


def patch_policy(root: str, **policy: object) -> None:
    """Rewrite known policy keys of a workspace before any manager opens it."""
    path = Path(root) / ".flow" / "format.json"
    fmt = orjson.loads(path.read_bytes())
    fmt["policy"].update(policy)
    path.write_bytes(orjson.dumps(fmt, option=orjson.OPT_INDENT_2))


class Flow:
    """`flow -w ROOT ...` in this process, with click's CliRunner."""

    def __init__(self, root: str, runner: CliRunner) -> None:
        self.root = root
        self.runner = runner

    def __call__(self, *args: str) -> Result:
        return self.runner.invoke(cli, ["-w", self.root, *args], catch_exceptions=False)

    def ok(self, *args: str) -> str:
        """Run a command that must exit 0; its stdout."""
        r = self(*args)
        assert r.exit_code == 0, f"flow {' '.join(args)} -> {r.exit_code}:\n{r.output}"
        return r.stdout

    def json(self, *args: str, code: int = 0) -> Any:
        r = self(args[0], "--json", *args[1:])  # before a submitted program's arguments
        assert r.exit_code == code, f"flow {' '.join(args)} -> {r.exit_code}:\n{r.output}"
        return orjson.loads(r.stdout)

    def submit(self, *args: str) -> dict[str, str]:
        """Submit one job; its {"id", "key", "placement"}."""
        [job] = self.json("submit", *args)["jobs"]
        return dict(job)

    def show(self, ident: str) -> dict[str, Any]:
        return dict(self.json("show", ident))

    def state(self, ident: str) -> str:
        return str(self.show(ident)["state"])

    def history(self, ident: str) -> list[dict[str, Any]]:
        return list(self.json("history", ident)["transitions"])

    def job_dir(self, job: dict[str, str]) -> Path:
        return Path(self.root) / job["placement"] / job["key"]

    def marker(self, job: dict[str, str]) -> Path:
        """The one marker file of a job, wherever it is."""
        found = [
            p
            for p in (Path(self.root) / ".flow" / "state").glob(f"*/{job['placement']}/*")
            if p.name.startswith(job["key"] + ".")
        ]
        assert len(found) == 1, found
        return found[0]


def serve_until_started(
    flow: Flow, managers: Managers, *submit_args: str
) -> tuple[dict[str, str], ManagerProcess, Path]:
    """Submit one job (`flow submit ARGS`) and serve it (`flow serve`, one worker) until its
    attempt has touched $FLOW_WORKDIR/started: the job, its manager and that workdir."""
    job = flow.submit(*submit_args)
    p = managers.start(flow.root, command="serve", workers=1)
    run = flow.job_dir(job) / "run"
    wait_for(lambda: (run / "started").exists() or p.poll() is not None, 20)
    assert p.poll() is None, log_of(p)
    return job, p, run


def wait_state(flow: Flow, ident: str, states: set[str], timeout: float = 20) -> str:
    """Poll until the job is in one of `states`; returns that state."""
    deadline = time.monotonic() + timeout
    while True:
        st = flow.state(ident)
        if st in states:
            return st
        if time.monotonic() >= deadline:
            raise AssertionError(f"job {ident} still {st} after {timeout} s, wanted {states}")
        time.sleep(0.05)


def holds(predicate: Callable[[], object], seconds: float, interval: float = 0.1) -> None:
    """Assert that `predicate` stays true for `seconds` (a bounded watch, not a sleep)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert predicate(), f"stopped holding: {predicate!r}"
        time.sleep(interval)


def holds_until(
    predicate: Callable[[], object],
    until: Callable[[], object],
    timeout: float,
    interval: float = 0.05,
) -> None:
    """Assert that `predicate` holds at every look until `until()` is true: until a positive
    sign that whatever could break it has had its chance (a manager's passes, say), not for
    a while. Fails if `until` is not met within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        assert predicate(), f"stopped holding: {predicate!r}"
        if until():
            assert predicate(), f"stopped holding: {predicate!r}"
            return
        assert time.monotonic() < deadline, f"not seen within {timeout} s: {until!r}"
        time.sleep(interval)


def live_processes(pids: set[int] | None = None, pgid: int | None = None) -> list[int]:
    """Pids (from `pids`, or of process group `pgid`) that exist and are not zombies."""
    return [
        p.pid
        for p in processes()
        if p.state != "Z"
        and ((pids is not None and p.pid in pids) or (pgid is not None and p.pgid == pgid))
    ]


def follow(root: str, ident: str, out: Path) -> subprocess.Popen[bytes]:
    """`flow logs --follow` as a process writing to `out`."""
    with open(out, "wb") as fh:
        return subprocess.Popen([*FLOW, "-w", root, "logs", ident, "--follow"], stdout=fh)


#: a move another actor makes, with a workspace of its own
Move = Callable[[Workspace], None]


def walk_while_moving(
    root: str, stream: str, after: State, move: Move, walk: Callable[[Workspace], T]
) -> T:
    """`walk(ws)` (fsck, gc: anything that lists the markers state by state), with the
    MarkerStream it lists them with (`stream`, the dotted name it is looked up by) replaced:
    once it has walked the markers of state `after`, `move` is called once with a workspace
    of its own (another actor steering a job at that moment). Returns what `walk` returns;
    fails if the walk never listed `after`."""

    class Choreographed(MarkerStream):
        def close(self) -> None:
            super().close()
            if self.state is after and not done:
                done.append(True)
                other = Workspace.open(root)
                try:
                    move(other)
                finally:
                    other.close()

    done: list[bool] = []
    ws = Workspace.open(root)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(stream, Choreographed)
            result = walk(ws)
    finally:
        ws.close()
    assert done, f"the walk never listed {after.value}"
    return result
