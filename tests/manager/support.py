"""Helpers for the manager tests: workspaces, job scripts, real manager processes, histories.

Managers run as real subprocesses and are signalled for real. Attempt processes live in
process groups of their own; when a test kills a manager they are orphaned, and this
machine's PID 1 does not reap orphans, so the test process makes itself their subreaper
(see OrphanReaper) instead of letting zombies look like live attempts.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import stat
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from helpers import (
    IN_PROCESS_MANAGERS,
    REAP_LOCK,
    ends_a_commit,
    processes,
    processes_with_env,
    wait_for,
)

from httk_flow.ops import lookup
from httk_flow.protocol import jobs, layout
from httk_flow.protocol.frames import Frame as Frames
from httk_flow.protocol.journal import RawFrame as Frame
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.transition import JobHandle
from httk_flow.protocol.workspace import Workspace

FLOW = [sys.executable, "-m", "httk_flow"]
#: `flow` in a process whose host name is argv[1]: a manager "on another host"
ELSEWHERE = [
    sys.executable,
    "-c",
    "import socket, sys; host = sys.argv.pop(1); socket.gethostname = lambda: host\n"
    "from httk_flow.cli.main import main; main()",
]
#: the longest any single manager run may take before a test gives up on it
RUN_TIMEOUT = 60.0

#: sourced at the top of every job script: publish an outcome by hand, as the protocol says
PRELUDE = r"""#!/bin/bash
set -u
# publish OUTCOME_JSON [CHILDREN_JSONL]: write outcome.tmp.<pid>/ and rename it to outcome.ready
publish() {
    local d="${FLOW_CONTROL_DIR:?not inside an attempt}/outcome.tmp.$$"
    mkdir "$d"
    printf '%s' "$1" > "$d/outcome.json"
    if [ $# -ge 2 ]; then printf '%s\n' "$2" > "$d/children.jsonl"; fi
    mv "$d" "$FLOW_CONTROL_DIR/outcome.ready"
}
# bump NAME: count calls in the persistent workdir; prints the new count
bump() {
    local f="$FLOW_WORKDIR/$1.count" n=0
    [ -f "$f" ] && n=$(cat "$f")
    n=$((n + 1))
    echo "$n" > "$f"
    echo "$n"
}
"""

#: advances main -> two -> three, then succeeds
THREE_STEPS = """
case "$FLOW_STEP" in
    main) publish '{"action":"advance","step":"two","message":"m"}' ;;
    two) publish '{"action":"advance","step":"three","message":"m"}' ;;
    three) publish '{"action":"succeed","message":"done"}' ;;
    *) exit 3 ;;
esac
"""


#: the parent spawns $FLOW_PARAM_kids children (c1..cN) and joins them ($FLOW_PARAM_join);
#: child number $FLOW_PARAM_bad fails
FAMILY = r"""
case "$FLOW_STEP" in
    main)
        kids=""
        for i in $(seq 1 "$FLOW_PARAM_kids"); do
            fail=0
            [ "$i" = "${FLOW_PARAM_bad:-0}" ] && fail=1
            kids="$kids{\"label\":\"c$i\",\"tag\":\"kid\",\"step\":\"child\",\"params\":{\"n\":$i,\"fail\":$fail}}
"
        done
        imp=""
        [ -n "${FLOW_PARAM_rescue:-}" ] && imp=",\"on_impossible\":\"$FLOW_PARAM_rescue\""
        join="${FLOW_PARAM_join:-all_succeeded}"
        publish "{\"action\":\"wait\",\"step\":\"collect\",\"join\":\"$join\"$imp}" "$kids"
        ;;
    child)
        if [ "$FLOW_PARAM_fail" = 1 ]; then
            publish '{"action":"fail","code":"child_broke"}'
        else
            publish '{"action":"succeed"}'
        fi
        ;;
    collect | rescue)
        cp "$FLOW_CONTROL_DIR/children" "$FLOW_WORKDIR/children.$FLOW_STEP.$FLOW_ATTEMPT_ID" \
            || echo missing > "$FLOW_WORKDIR/children.$FLOW_STEP.$FLOW_ATTEMPT_ID"
        if [ "${FLOW_PARAM_flaky_collect:-0}" = 1 ] && [ "$(bump collect)" -eq 1 ]; then
            exit 1
        fi
        publish '{"action":"succeed","message":"collected"}'
        ;;
esac
"""


# -- workspaces and jobs ----------------------------------------------------------------


def make_workspace(
    path: Path, *, backoff_base: float = 0.2, backoff_cap: float = 2.0, keep_files: bool = False
) -> str:
    """A fresh workspace whose retry backoff is short enough for tests (`keep_files`:
    committed attempts keep every file, for a test that reads them afterwards)."""
    ws = Workspace.create(str(path), keep_attempt_files=keep_files)
    ws.close()
    # rewritten before any process opens the workspace; both keys are known policy keys
    fmt_path = Path(ws.flow) / "format.json"
    fmt = orjson.loads(fmt_path.read_bytes())
    fmt["policy"].update(backoff_base=backoff_base, backoff_cap=backoff_cap)
    fmt_path.write_bytes(orjson.dumps(fmt, option=orjson.OPT_INDENT_2))
    return ws.root


def write_script(directory: Path, name: str, body: str) -> str:
    """An executable bash job script: PRELUDE followed by `body`."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(PRELUDE + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def submit(root: str, program: str, count: int = 1, **fields: Any) -> list[str]:
    """Submit `count` jobs running `program`; returns their ids."""
    ws = Workspace.open(root)
    try:
        reqs = [SubmitRequest(program=program, **fields) for _ in range(count)]
        return [spec.id for spec in Submitter(ws, actor="test").submit(reqs)]
    finally:
        ws.close()


# -- reading jobs back ------------------------------------------------------------------


@dataclass(frozen=True)
class JobInfo:
    handle: JobHandle
    frames: list[Frame]

    @property
    def state(self) -> State:
        return self.handle.state

    @property
    def last(self) -> Frame:
        return self.frames[-1]

    @property
    def failure_code(self) -> str | None:
        failure = self.last.get("failure")
        return failure.get("code") if isinstance(failure, dict) else None

    @property
    def attempts(self) -> list[dict[str, Any]]:
        """One entry per launched attempt, oldest first (as `flow show` reports them)."""
        typed = [Frames.from_json(f) for f in self.frames]
        view = lookup.JobView(self.handle, None, None, typed[-1], typed)
        return [a.to_json() for a in view.attempts]

    def commits(self) -> list[Frame]:
        """Frames that end a commit (committing -> anything but committing, or the direct
        running -> succeeded), oldest first."""
        return [f for f in self.frames if ends_a_commit(f)]

    def job_dir(self, root: str) -> Path:
        return Path(root) / self.handle.placement / self.handle.key


def job(root: str, ident: str) -> JobInfo:
    ws = Workspace.open(root)
    try:
        h = lookup.find(ws, ident)
        return JobInfo(h, jobs.history_json(ws, h))
    finally:
        ws.close()


def all_jobs(root: str) -> list[JobInfo]:
    ws = Workspace.open(root)
    try:
        return [JobInfo(h, jobs.history_json(ws, h)) for h in jobs.all_jobs(ws)]
    finally:
        ws.close()


def marker_keys(root: str) -> Counter[str]:
    """How many marker files each job key has, over every state kind (must be 1 each)."""
    counts: Counter[str] = Counter()
    base = Path(root) / ".flow" / "state"
    for st in State:
        for _, _, files in os.walk(base / st.value):
            counts.update(f.split(".p", 1)[0] for f in files)
    return counts


def committed(info: JobInfo) -> list[tuple[int, str, str]]:
    """(activation, step, why) of every finished commit, oldest first."""
    return [
        (int(before["act"]), str(f["attempt"]["step"]), str(f["why"]))
        for before, f in zip(info.frames, info.frames[1:], strict=False)
        if ends_a_commit(f)
    ]


def children_of(root: str, parent: JobInfo) -> list[JobInfo]:
    placement = f"{parent.handle.placement}/{parent.handle.key}"
    return [j for j in all_jobs(root) if j.handle.placement == placement]


# -- manager processes --------------------------------------------------------------------


class OrphanReaper:
    """While entered, this process is the subreaper of orphaned attempts and reaps them.

    Only zombies in a process group other than ours are reaped: attempts run in groups of
    their own, while every process a test starts directly stays in ours and is waited for
    by its Popen object. On exit the last orphans are waited for and the role is given up.
    """

    PR_SET_CHILD_SUBREAPER = 36

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._libc = ctypes.CDLL(None, use_errno=True)

    def __enter__(self) -> OrphanReaper:
        if self._libc.prctl(self.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            warnings.warn(
                "cannot become a subreaper: orphaned attempts may linger as zombies",
                stacklevel=2,
            )
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="orphan-reaper", daemon=True)
        self._thread.start()
        return self

    def start(self) -> None:
        """Enter for the rest of the process (a session-wide reaper); idempotent."""
        if self._thread is None:
            self.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        deadline = time.monotonic() + 5
        while self.orphans() and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.02)
        self._thread = None
        self._libc.prctl(self.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            self.reap()

    @staticmethod
    def orphans() -> list[tuple[int, str]]:
        """(pid, state) of every child of ours outside our process group."""
        me, my_group = os.getpid(), os.getpgrp()
        return [(p.pid, p.state) for p in processes() if p.ppid == me and p.pgid != my_group]

    def reap(self) -> None:
        with REAP_LOCK:
            if IN_PROCESS_MANAGERS[0]:
                # a manager in this process would find its attempt reaped and its status
                # lost (recorded as a process failure, and the job run again)
                return
            for pid, state in self.orphans():
                if state == "Z":
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)


def processes_of(root: str) -> list[int]:
    """Pids of attempt processes (and their children) serving jobs of workspace `root`."""
    return processes_with_env(f"FLOW_WORKSPACE_DIR={root}")


class ManagerProcess(subprocess.Popen[bytes]):
    """A manager started by a test, with the file its output goes to."""

    log: Path | None = None


class Managers:
    """The manager processes of one test; all are killed (with their attempts) at teardown."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[ManagerProcess] = []
        self.roots: set[str] = set()
        self._n = 0

    def start(
        self,
        root: str,
        *args: str,
        command: str = "run",
        workers: int = 2,
        env: dict[str, str] | None = None,
        quiet: bool = True,
        host: str | None = None,
    ) -> ManagerProcess:
        """`flow run|serve -w ROOT --workers N [--quiet] ARGS`, output to a log file.

        `host` makes the manager believe it runs on another host (its gethostname lies).
        """
        self._n += 1
        log = self.tmp / f"manager-{self._n}.log"
        full_env = dict(os.environ)
        full_env.pop("FLOW_CRASH_AT", None)
        full_env.update(env or {})
        flow_argv = FLOW if host is None else [*ELSEWHERE, host]
        argv = [*flow_argv, command, "-w", root, "--workers", str(workers)]
        argv += ["--quiet", *args] if quiet else list(args)
        with open(log, "wb") as out:
            p = ManagerProcess(argv, stdout=out, stderr=subprocess.STDOUT, env=full_env)
        p.log = log
        self.procs.append(p)
        self.roots.add(root)
        return p

    def run(self, root: str, *args: str, timeout: float = RUN_TIMEOUT, **kw: Any) -> int:
        """Start `flow run` and wait for it; returns its exit status."""
        p = self.start(root, *args, **kw)
        try:
            return p.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"flow run did not finish within {timeout} s:\n{log_of(p)}"
            ) from None

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for root in self.roots:
            for pid in processes_of(root):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)


def log_of(p: ManagerProcess) -> str:
    """The tail of a manager's output, for assertion messages."""
    return p.log.read_text(errors="replace")[-4000:] if p.log else ""


def flow(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run one `flow` command to completion."""
    return subprocess.run([*FLOW, *args], capture_output=True, text=True, check=check, timeout=60)


def dump(root: str, ids: Sequence[str] = ()) -> str:
    """A readable account of jobs for assertion messages."""
    infos = [job(root, i) for i in ids] if ids else all_jobs(root)
    lines = []
    for info in infos:
        lines.append(f"{info.handle.key} {info.state.value}")
        for f in info.frames:
            lines.append(
                f"    {f.get('from', '-')} -> {f.get('to')} step={f.get('step')} "
                f"act={f.get('act')} try={f.get('try')} why={f.get('why')} by={f.get('by')}"
            )
    return "\n".join(lines)


# -- scenes with several managers: short leases, marker watches, fsck ---------------------


def leased_workspace(
    path: Path,
    lease: str = "1s",
    *,
    backoff_base: float = 0.2,
    backoff_cap: float = 2.0,
    keep_files: bool = False,
) -> str:
    """`flow init --lease LEASE PATH` run for real, then make_workspace's short retry backoff.
    `keep_files`: every file of a committed attempt is kept (--keep-attempt-files)."""
    keep = ["--keep-attempt-files"] if keep_files else []
    r = flow("init", str(path), "--lease", lease, "--json", *keep)
    assert r.returncode == 0, r.stderr
    root = str(orjson.loads(r.stdout)["workspace"])
    fmt_path = Path(root) / ".flow" / "format.json"
    fmt = orjson.loads(fmt_path.read_bytes())
    fmt["policy"].update(backoff_base=backoff_base, backoff_cap=backoff_cap)
    fmt_path.write_bytes(orjson.dumps(fmt, option=orjson.OPT_INDENT_2))
    return root


def manager_ids(root: str) -> dict[int, str]:
    """pid -> manager id, from every heartbeat written so far."""
    out: dict[int, str] = {}
    for path in (Path(root) / ".flow" / "managers").glob("*/heartbeat.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            beat = orjson.loads(path.read_bytes())
            out[int(beat["pid"])] = str(beat["id"])
    return out


def heartbeat_of(root: str, p: ManagerProcess) -> dict[str, object]:
    """The heartbeat body of manager process `p` ({} before its first)."""
    for path in (Path(root) / ".flow" / "managers").glob("*/heartbeat.json"):
        try:
            body = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        if body.get("pid") == p.pid:
            return dict(body)
    return {}


def beats(root: str, p: ManagerProcess) -> int:
    """The `seq` of the latest heartbeat of manager process `p` (0 before its first).

    A manager rewrites its heartbeat from its loop every third of its lease, so a seq that
    advances is the positive sign that the manager keeps running its passes."""
    seq = heartbeat_of(root, p).get("seq", 0)
    return seq if isinstance(seq, int) else 0


def wait_beats(root: str, p: ManagerProcess, n: int, timeout: float = 60.0) -> None:
    """Wait until manager process `p` has heartbeated `n` more times than now (it ran on
    for at least (n - 1) thirds of its lease); it must still be running then."""
    start = beats(root, p)
    wait_for(lambda: beats(root, p) >= start + n or p.poll() is not None, timeout)
    assert p.poll() is None, f"manager exited with {p.returncode}:\n{log_of(p)}"


def manager_up(root: str, p: ManagerProcess, timeout: float = 30.0) -> str:
    """Wait for the manager process `p` to heartbeat; returns its manager id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        mid = manager_ids(root).get(p.pid)
        if mid is not None:
            return mid
        if p.poll() is not None:
            raise AssertionError(f"manager exited with {p.returncode}:\n{log_of(p)}")
        time.sleep(0.02)
    raise AssertionError(f"manager {p.pid} wrote no heartbeat within {timeout} s")


def markers_at(root: str, placement: str) -> dict[str, list[str]]:
    """Marker paths per job key, over every state kind of one placement (not below it)."""
    out: dict[str, list[str]] = {}
    base = Path(root) / ".flow" / "state"
    for st in State:
        for d in _with_class_dirs(base / st.value / placement):
            try:
                names = [e.name for e in os.scandir(d) if e.is_file(follow_symlinks=False)]
            except OSError:
                continue
            for n in names:
                out.setdefault(n.split(".p", 1)[0], []).append(str(d / n))
    return out


def _with_class_dirs(d: Path) -> list[Path]:
    """A placement's state directory and its class directories (`@<class>`, ready jobs)."""
    try:
        return [d, *(d / e.name for e in os.scandir(d) if e.name.startswith("@"))]
    except OSError:
        return [d]


def locate(root: str, placement: str, key: str) -> tuple[State, str] | None:
    """(state, marker name) of one job, found by listing each state kind of its placement."""
    base = Path(root) / ".flow" / "state"
    for st in State:
        for d in _with_class_dirs(base / st.value / placement):
            with contextlib.suppress(OSError):
                for e in os.scandir(d):
                    if e.name.startswith(key + ".p"):
                        return st, e.name
    return None


def frame_named(root: str, marker_name: str) -> Frame:
    """The journal frame a marker name refers to."""
    from httk_flow.protocol.names import Marker

    ws = Workspace.open(root)
    try:
        return ws.reader.read(Marker.from_name(marker_name).ref)
    finally:
        ws.close()


class MarkerWatch:
    """While entered, a thread lists the markers of one placement over and over: every job
    there must have exactly one marker at every look.

    A listing is not atomic: a marker renamed from one state kind to another while the
    kinds are listed one after the other may be seen twice. A key listed twice therefore
    counts as duplicated only when its files all still exist once the listing is done (a
    marker that moved on leaves no file behind under its old name).
    """

    def __init__(self, root: str, placement: str, interval: float = 0.05) -> None:
        self.root = root
        self.placement = placement
        self.interval = interval
        self.duplicates: dict[str, list[str]] = {}
        self.looks = 0
        self.most = 0  # the most keys seen in one look
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def look(self) -> int:
        seen = markers_at(self.root, self.placement)
        for key, paths in seen.items():
            if len(paths) > 1 and all(os.path.exists(p) for p in paths):
                self.duplicates.setdefault(key, paths)
        self.looks += 1
        self.most = max(self.most, len(seen))
        return len(seen)

    def __enter__(self) -> MarkerWatch:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="marker-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.look()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.look()


def takeovers(frames: Sequence[Frame]) -> list[tuple[Frame, Frame]]:
    """(the committing frame before, the takeover frame) of each committing -> committing."""
    import itertools

    return [
        (before, f)
        for before, f in itertools.pairwise(frames)
        if f.get("from") == State.COMMITTING.value and f.get("to") == State.COMMITTING.value
    ]


def fsck_report(root: str) -> dict[str, Any]:
    """`flow fsck --json`, parsed; the exit status is checked against `clean`."""
    r = flow("fsck", "-w", root, "--json")
    report: dict[str, Any] = orjson.loads(r.stdout)
    assert r.returncode == (0 if report["clean"] else 1), r.stderr
    return report


def attempt_dirs(job_dir: Path) -> list[str]:
    """The attempt directory names of one job, sorted (a0001, a0002, ...)."""
    try:
        entries = list(os.scandir(job_dir))
    except FileNotFoundError:
        return []
    return sorted(e.name for e in entries if layout.is_attempt_name(e.name) and e.is_dir())


def write_program(directory: Path, name: str, text: str) -> str:
    """An executable file holding `text` exactly (a program using the bash API, say)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def whole_log(p: ManagerProcess) -> str:
    """All of a manager's output (log_of keeps only its tail)."""
    return p.log.read_text(errors="replace") if p.log else ""
