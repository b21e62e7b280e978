#!/usr/bin/env python3
"""Benchmarks of httk_flow, each figure beside a baseline measured in the same run.

    python benchmarks/run.py --profile quick|full [--json OUT.json] [--only NAME]...

Benchmarks are functions registered by name in BENCHMARKS; each returns rows
{name, n, value, unit, baseline?, ratio?, ...}. Every workspace is built under one
temporary directory, removed afterwards. The machine is assumed shared and noisy: each
measurement runs up to three times (median reported) and is quoted as a ratio to a
baseline taken in the same repetition, not as an absolute to compare across machines.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")
#: seconds under which a repetition counts as cheap: repeated even past the deadline
CHEAP = 3.0
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- profiles and rows -------------------------------------------------------------


@dataclass(frozen=True)
class Profile:
    name: str
    #: array sizes for bulk submission
    submit_sizes: tuple[int, ...]
    #: no-op jobs run end to end
    e2e_jobs: int
    #: ready backlogs for the memory and first-claim benchmarks
    backlogs: tuple[int, ...]
    #: how long the memory benchmark lets a manager serve
    serve_seconds: float
    #: workspace sizes for the `flow status` benchmark
    status_sizes: tuple[int, ...] = (100_000,)
    repeats: int = 3
    #: another repetition starts only if it should end within this many seconds of the first
    budget: float = math.inf
    #: past this many seconds since the start, only cheap measurements are repeated
    deadline: float = math.inf


PROFILES = {
    "quick": Profile(
        "quick", (10_000,), 2_000, (10_000, 100_000), 2.0, budget=30.0, deadline=150.0
    ),
    "full": Profile(
        "full",
        (10_000, 100_000),
        2_000,
        (10_000, 100_000),
        5.0,
        status_sizes=(100_000, 1_000_000),
        budget=600.0,
    ),
    #: checks the runner itself in seconds; its figures mean nothing
    "smoke": Profile("smoke", (500,), 100, (500, 2_000), 1.0, status_sizes=(2_000,), budget=5.0),
}


@dataclass
class Row:
    """One figure: the median of its samples, beside a baseline measured in the same run.

    With paired baseline samples (one per repetition, taken next to it), ratio is the
    median of the per-repetition ratios, which cancels most of a shared machine's drift;
    otherwise it is value / baseline.
    """

    name: str
    n: int
    value: float
    unit: str
    baseline: float | None = None
    baseline_name: str | None = None
    target: str | None = None
    ok: bool | None = None
    samples: list[float] = field(default_factory=list)
    baseline_samples: list[float] = field(default_factory=list)
    command: str = ""

    @property
    def ratio(self) -> float | None:
        pairs = list(zip(self.samples, self.baseline_samples, strict=False))
        if pairs and len(pairs) == len(self.samples) and all(b for _, b in pairs):
            return median([v / b for v, b in pairs])
        if self.baseline is None or self.baseline == 0:
            return None
        return self.value / self.baseline

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "n": self.n,
            "value": self.value,
            "unit": self.unit,
        }
        if self.baseline is not None:
            out.update(baseline=self.baseline, baseline_name=self.baseline_name, ratio=self.ratio)
            if self.baseline_samples:
                out["baseline_samples"] = self.baseline_samples
        if self.target is not None:
            out.update(target=self.target, ok=self.ok)
        out.update(runs=len(self.samples), samples=self.samples, command=self.command)
        return out


# -- the bench context: temporary root, subprocesses, repetitions, fixtures ---------


class BenchError(Exception):
    """A benchmark could not produce its figure (a command failed, a job did not finish)."""


class Bench:
    def __init__(
        self,
        profile: Profile,
        root: str,
        flow: str,
        *,
        cprofile: str | None = None,
        package: str | None = None,
    ) -> None:
        self.profile = profile
        self.root = root
        self.flow = flow
        self.python = sys.executable
        self.cprofile = cprofile
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FLOW_")}
        if package:
            # put another source tree (e.g. `git archive` of a commit) ahead of the installed one
            self.env["PYTHONPATH"] = os.pathsep.join(
                [package, *filter(None, [self.env.get("PYTHONPATH")])]
            )
        self.started = time.monotonic()
        self._count = 0
        self._fixtures: dict[tuple[str, int], str] = {}

    def say(self, message: str) -> None:
        print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    def path(self, label: str) -> str:
        self._count += 1
        return os.path.join(self.root, f"{self._count:03d}-{label}")

    def sh(self, argv: Sequence[str], *, capture: bool = False) -> str:
        """Run a command to completion; BenchError naming it when it fails."""
        p = subprocess.run(
            argv,
            env=self.env,
            cwd=self.root,  # not the caller's directory: `python -c` imports from there first
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            check=False,
        )
        if p.returncode != 0:
            err = p.stderr.decode(errors="replace").strip()[-2000:]
            raise BenchError(f"`{shlex.join(argv)}` exited {p.returncode}: {err}")
        return p.stdout.decode() if capture else ""

    def timed(self, argv: Sequence[str]) -> float:
        """Wall seconds of one command, from spawn to exit."""
        t0 = time.perf_counter()
        self.sh(argv)
        return time.perf_counter() - t0

    def init(self, label: str, *, durable: bool = False) -> str:
        ws = self.path(label)
        self.sh([self.flow, "init", ws, "--durable" if durable else "--no-durable"])
        return ws

    def repeat(self, what: str, fn: Callable[[], T]) -> list[T]:
        """Up to profile.repeats runs of fn; stops early when the next would overrun the budget."""
        out: list[T] = []
        t0 = time.monotonic()
        for i in range(self.profile.repeats):
            t1 = time.monotonic()
            out.append(fn())
            last = time.monotonic() - t1
            self.say(f"{what}: run {i + 1} took {last:.1f}s")
            now = time.monotonic()
            late = now - self.started > self.profile.deadline and last > CHEAP
            if now - t0 + last > self.profile.budget or late:
                if i + 1 < self.profile.repeats:
                    self.say(f"{what}: stopping after {i + 1} run(s): over the profile's budget")
                break
        return out

    def discard(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def ready_workspace(self, n: int) -> str:
        """A workspace holding n no-op jobs already registered to ready (built once per run)."""
        key = ("ready", n)
        if key not in self._fixtures:
            t0 = time.monotonic()
            ws = self.init(f"ready-{n}")
            self.sh([self.flow, "-w", ws, "submit", "--array", f"1-{n}", "true"])
            got = int(self.sh([self.python, "-c", REGISTER_SCRIPT, ws], capture=True))
            if got != n:
                raise BenchError(f"registered {got} of {n} jobs in {ws}")
            self.say(f"fixture: {n} ready jobs in {time.monotonic() - t0:.1f}s")
            self._fixtures[key] = ws
        return self._fixtures[key]


#: registers every submitted job through the package API (as a manager's register pass would)
REGISTER_SCRIPT = """
import sys
from httk_flow.discovery import walk_all
from httk_flow.jobs import register
from httk_flow.states import State
from httk_flow.workspace import Workspace

ws = Workspace.open(sys.argv[1])
# list first: markers renamed out of a directory being scanned may be skipped or repeated
handles = list(walk_all(ws, State.SUBMITTED))
for h in handles:
    register(ws, h, actor="bench")
ws.close()
print(len(handles))
"""

#: the filesystem work of a submission without the engine: per job a payload directory
#: published by rename and an empty marker, one journal write per 512 jobs; with "1",
#: the fsyncs of durable mode (file, its directory, the parents before each batch's markers)
FLOOR_SCRIPT = """
import os, sys, uuid

root, n, durable = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
def fsync_dir(p):
    fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)
for d in ("tmp", "journal", "jobs", "state/submitted/jobs"):
    os.makedirs(os.path.join(root, d))
journal = os.open(os.path.join(root, "journal", "0.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
payload, frame = b"j" * 500, b"f" * 230 + b"\\n"
made = set()
for start in range(0, n, 512):
    ids = [uuid.uuid4().hex for _ in range(min(512, n - start))]
    parents, marker_dirs = set(), set()
    for i in ids:
        tmp = os.path.join(root, "tmp", i)
        os.mkdir(tmp)
        fd = os.open(os.path.join(tmp, "job.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        os.write(fd, payload)
        if durable:
            os.fsync(fd)
        os.close(fd)
        if durable:
            fsync_dir(tmp)
        parent = os.path.join(root, "jobs", i[:3])
        if parent not in made:
            os.makedirs(parent, exist_ok=True)
            made.add(parent)
        os.rename(tmp, os.path.join(parent, i))
        parents.add(parent)
    if durable:
        for p in parents:
            fsync_dir(p)
    os.write(journal, frame * len(ids))
    if durable:
        os.fsync(journal)
    for i in ids:
        d = os.path.join(root, "state", "submitted", "jobs", i[:3])
        if d not in made:
            os.makedirs(d, exist_ok=True)
            made.add(d)
        marker = os.path.join(d, i + ".p500.g0.x-0-0")
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        marker_dirs.add(d)
    if durable:
        for d in marker_dirs:
            fsync_dir(d)
"""


# -- the registry ---------------------------------------------------------------------

BenchFn = Callable[[Bench], list[Row]]
BENCHMARKS: dict[str, BenchFn] = {}


def benchmark(name: str) -> Callable[[BenchFn], BenchFn]:
    def add(fn: BenchFn) -> BenchFn:
        BENCHMARKS[name] = fn
        return fn

    return add


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else math.nan


# -- 1. bulk submission ---------------------------------------------------------------


@benchmark("submit")
def bench_submit(b: Bench) -> list[Row]:
    """jobs/s through one `flow submit --array 1-N true`, beside the bare filesystem floor."""
    rows = []
    for durable in (False, True):
        for n in b.profile.submit_sizes:
            mode = "durable" if durable else "non-durable"

            def once(n: int = n, durable: bool = durable) -> tuple[float, float]:
                ws = b.init(f"submit-{n}", durable=durable)
                flow_s = b.timed([b.flow, "-w", ws, "submit", "--array", f"1-{n}", "true"])
                b.discard(ws)
                floor = b.path(f"floor-{n}")
                floor_s = b.timed([b.python, "-c", FLOOR_SCRIPT, floor, str(n), str(int(durable))])
                b.discard(floor)
                return n / flow_s, n / floor_s

            runs = b.repeat(f"submit {mode} n={n}", once)
            rate = median([r[0] for r in runs])
            rows.append(
                Row(
                    f"submit {mode}",
                    n,
                    rate,
                    "jobs/s",
                    baseline=median([r[1] for r in runs]),
                    baseline_name="filesystem floor (same files, no engine)",
                    target=None if durable else ">= 5000 jobs/s",
                    ok=None if durable else rate >= 5000,
                    samples=[r[0] for r in runs],
                    baseline_samples=[r[1] for r in runs],
                    command=f"flow init WS{' --durable' if durable else ''}; "
                    f"time flow -w WS submit --array 1-{n} true",
                )
            )
    return rows


# -- 2. end-to-end throughput ----------------------------------------------------------


@benchmark("e2e")
def bench_e2e(b: Bench) -> list[Row]:
    """N no-op jobs through `flow run --workers 2`, beside `xargs -P2` running the same."""
    n = b.profile.e2e_jobs
    xargs = ["sh", "-c", f"seq {n} | xargs -P2 -n1 sh -c true"]

    def once() -> tuple[float, float]:
        xargs_s = b.timed(xargs)
        ws = b.init(f"e2e-{n}")
        b.sh([b.flow, "-w", ws, "submit", "--array", f"1-{n}", "true"])
        flow_s = b.timed([b.flow, "-w", ws, "run", "--workers", "2", "--quiet"])
        _check_all_succeeded(b, ws, n)
        b.discard(ws)
        return n / flow_s, n / xargs_s

    runs = b.repeat(f"e2e n={n}", once)
    rate, base = median([r[0] for r in runs]), median([r[1] for r in runs])
    ratio = median([r[0] / r[1] for r in runs])
    if b.cprofile:
        _profile_run(b, n)
    return [
        Row(
            "e2e flow run --workers 2",
            n,
            rate,
            "jobs/s",
            baseline=base,
            baseline_name="seq N | xargs -P2 -n1 sh -c true",
            target=">= 0.25 x xargs",
            ok=ratio >= 0.25,
            samples=[r[0] for r in runs],
            baseline_samples=[r[1] for r in runs],
            command=f"flow submit --array 1-{n} true; time flow run --workers 2 --quiet  "
            f"# beside: time {xargs[2]}",
        )
    ]


def _check_all_succeeded(b: Bench, ws: str, n: int) -> None:
    status = json.loads(b.sh([b.flow, "-w", ws, "status", "--json"], capture=True))
    done = status["counts"]["succeeded"]
    if done != n:
        raise BenchError(f"{done} of {n} jobs succeeded in {ws}: {status['counts']}")


def _profile_run(b: Bench, n: int) -> None:
    """One more run of the same workload under cProfile; prints the top of the profile."""
    import pstats

    assert b.cprofile is not None
    ws = b.init(f"e2e-prof-{n}")
    b.sh([b.flow, "-w", ws, "submit", "--array", f"1-{n}", "true"])
    argv = [b.python, "-m", "cProfile", "-o", b.cprofile, "-m", "httk_flow", "-w", ws]
    s = b.timed([*argv, "run", "--workers", "2", "--quiet"])
    b.discard(ws)
    b.say(f"profiled run: {n / s:.0f} jobs/s under cProfile; profile in {b.cprofile}")
    stats = pstats.Stats(b.cprofile, stream=sys.stderr)
    stats.sort_stats("cumulative").print_stats(30)
    stats.sort_stats("tottime").print_stats(15)


# -- 3. manager memory with a large ready backlog --------------------------------------


def _proc_kb(pid: int, field_name: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise BenchError(f"no {field_name} in /proc/{pid}/status")


def _stop(p: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """SIGTERM (the manager drains), then SIGKILL if it does not exit within timeout."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


BARE_RSS_SCRIPT = """
import httk_flow.cli.main, httk_flow.manager.loop
with open("/proc/self/status") as fh:
    print(next(line.split()[1] for line in fh if line.startswith("VmHWM:")))
"""


@benchmark("rss")
def bench_rss(b: Bench) -> list[Row]:
    """Peak RSS of `flow serve --workers 2` with N ready jobs, beside the bare import."""
    bare_argv = [b.python, "-c", BARE_RSS_SCRIPT]
    bare = median(b.repeat("bare import RSS", lambda: int(b.sh(bare_argv, capture=True))))
    secs = b.profile.serve_seconds
    rows = []
    for n in b.profile.backlogs:
        ws = b.ready_workspace(n)
        argv = [b.flow, "-w", ws, "serve", "--workers", "2", "--quiet"]

        def once(argv: list[str] = argv) -> float:
            p = subprocess.Popen(
                argv, env=b.env, cwd=b.root, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
            )
            try:
                time.sleep(secs)
                if p.poll() is not None:
                    raise BenchError(f"`{shlex.join(argv)}` exited early with {p.returncode}")
                peak = _proc_kb(p.pid, "VmHWM")  # just before signalling: the peak so far
            finally:
                _stop(p)
            return peak / 1024

        mb = b.repeat(f"rss n={n}", once)
        rows.append(
            Row(
                "manager peak RSS (VmHWM)",
                n,
                median(mb),
                "MB",
                baseline=bare / 1024,
                baseline_name="python importing the CLI and manager",
                target="< 100 MB, flat in N",
                ok=median(mb) < 100,
                samples=mb,
                command=f"flow serve --workers 2 --quiet on {n} ready jobs; "
                f"VmHWM after {secs:g}s, then SIGTERM",
            )
        )
    return rows


# -- 3b. the bash runner API -----------------------------------------------------------

API_RUNNER = """#!/usr/bin/env bash
source "$FLOW_BASH_API"
flow_steps main
step_main() { flow_succeed "done"; }
flow_main "$@"
"""

SUCCEED_LOOP = """
set -e
source "$1"
n=$2
mkdir -p "$3"/a{0..999}  # made before the clock starts: only flow_succeed is timed
start=$EPOCHREALTIME
for ((i = 0; i < n; i++)); do
    export FLOW_CONTROL_DIR=$3/a$i
    _flow_published=0
    flow_succeed "message $i with \"quotes\" and a tab\t"
done
end=$EPOCHREALTIME
echo "$start $end"
"""

SPAWN_LOOP = """
n=$1
start=$EPOCHREALTIME
for ((i = 0; i < n; i++)); do /bin/true; done
end=$EPOCHREALTIME
echo "$start $end"
"""


def _bash_seconds(out: str) -> float:
    start, end = (float(x) for x in out.split()[-2:])
    return end - start


@benchmark("bash_api")
def bench_bash_api(b: Bench) -> list[Row]:
    """flow_succeed per call from bash (beside one external command), and API-runner jobs/s."""
    import httk_flow.manager.attempts as attempts

    api = attempts.BASH_API
    calls = 500
    rows = []

    def one_call() -> tuple[float, float]:
        d = b.path("succeed")
        os.makedirs(d)
        out = b.sh(["bash", "-c", SUCCEED_LOOP, "bench", api, str(calls), d], capture=True)
        b.discard(d)
        base = b.sh(["bash", "-c", SPAWN_LOOP, "bench", str(calls)], capture=True)
        return _bash_seconds(out) / calls * 1000, _bash_seconds(base) / calls * 1000

    runs = b.repeat("flow_succeed", one_call)
    ms = median([r[0] for r in runs])
    rows.append(
        Row(
            "bash flow_succeed per call",
            calls,
            ms,
            "ms",
            baseline=median([r[1] for r in runs]),
            baseline_name="one /bin/true started from bash",
            target="< 5 ms, no interpreter start",
            ok=ms < 5,
            samples=[r[0] for r in runs],
            baseline_samples=[r[1] for r in runs],
            command=f"bash loop over fresh control dirs: flow_succeed MSG  (x{calls})",
        )
    )
    n = b.profile.e2e_jobs
    xargs = ["sh", "-c", f"seq {n} | xargs -P2 -n1 bash -c true"]
    prog = b.path("api-runner.sh")
    with open(prog, "w") as fh:
        fh.write(API_RUNNER)
    os.chmod(prog, 0o755)

    def once() -> tuple[float, float]:
        xargs_s = b.timed(xargs)
        ws = b.init(f"api-{n}")
        b.sh([b.flow, "-w", ws, "submit", "--array", f"1-{n}", prog])
        flow_s = b.timed([b.flow, "-w", ws, "run", "--workers", "2", "--quiet"])
        _check_all_succeeded(b, ws, n)
        b.discard(ws)
        return n / flow_s, n / xargs_s

    runs2 = b.repeat(f"api-runner n={n}", once)
    rate = median([r[0] for r in runs2])
    rows.append(
        Row(
            "e2e bash-API jobs, flow run --workers 2",
            n,
            rate,
            "jobs/s",
            baseline=median([r[1] for r in runs2]),
            baseline_name="seq N | xargs -P2 -n1 bash -c true",
            samples=[r[0] for r in runs2],
            baseline_samples=[r[1] for r in runs2],
            command=f"flow submit --array 1-{n} api-runner.sh (flow_succeed); "
            "time flow run --workers 2 --quiet",
        )
    )
    return rows


# -- 3c. flow status on big workspaces --------------------------------------------------


@benchmark("status")
def bench_status(b: Bench) -> list[Row]:
    """`flow status` on N submitted jobs, beside `find` listing the same state tree."""
    rows = []
    for n in b.profile.status_sizes:
        ws = b.init(f"status-{n}")
        b.sh([b.flow, "-w", ws, "submit", "--array", f"1-{n}", "true"])
        find = ["sh", "-c", f"find {ws}/.flow/state -type f | wc -l"]

        def once(ws: str = ws, find: list[str] = find) -> tuple[float, float]:
            return b.timed([b.flow, "-w", ws, "status"]), b.timed(find)

        runs = b.repeat(f"status n={n}", once)
        secs = median([r[0] for r in runs])
        limit = 1.0 if n <= 100_000 else 10.0
        rows.append(
            Row(
                "flow status",
                n,
                secs,
                "s",
                baseline=median([r[1] for r in runs]),
                baseline_name="find .flow/state -type f | wc -l",
                target=f"< {limit:g} s",
                ok=secs < limit,
                samples=[r[0] for r in runs],
                baseline_samples=[r[1] for r in runs],
                command=f"flow submit --array 1-{n} true; time flow status",
            )
        )
        b.discard(ws)
    return rows


# -- 4. cold start to first claim --------------------------------------------------------


def _first_claim(b: Bench, argv: list[str]) -> tuple[float, float]:
    """(seconds from spawn to the first claim logged, seconds from 'serving' to it)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(
        argv,
        env=b.env,
        cwd=b.root,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    serving = None
    try:
        assert p.stderr is not None
        for line in p.stderr:
            now = time.perf_counter() - t0
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(ev, dict):
                continue
            if serving is None and ev.get("event") == "info" and "serving" in ev.get("message", ""):
                serving = now
            if ev.get("event") == "transition" and ev.get("to") == "claimed":
                return now, now - (serving if serving is not None else 0.0)
        raise BenchError(f"`{shlex.join(argv)}` exited without claiming a job")
    finally:
        _stop(p)
        if p.stderr is not None:
            p.stderr.close()


@benchmark("claim")
def bench_claim(b: Bench) -> list[Row]:
    """Cold `flow serve` start to its first claim with N ready jobs, beside the bare import."""
    imp_argv = [b.python, "-c", "import httk_flow.cli.main"]
    rows = []
    for n in b.profile.backlogs:
        ws = b.ready_workspace(n)
        argv = [b.flow, "-w", ws, "serve", "--workers", "1", "--log-format", "json"]

        def once(argv: list[str] = argv) -> tuple[float, float, float]:
            imp = b.timed(imp_argv)  # paired: the same moment's interpreter start-up
            total, tick = _first_claim(b, argv)
            return total, tick, imp

        runs = b.repeat(f"first claim n={n}", once)
        total = [r[0] for r in runs]
        work = [r[0] - r[2] for r in runs]
        cmd = f"flow serve --workers 1 --log-format json on {n} ready jobs"
        rows += [
            Row(
                "cold start to first claim",
                n,
                median(total),
                "s",
                baseline=median([r[2] for r in runs]),
                baseline_name='python -c "import httk_flow.cli.main"',
                samples=total,
                baseline_samples=[r[2] for r in runs],
                command=cmd + "; spawn -> first transition to claimed on stderr",
            ),
            Row(
                "  manager work (start - import)",
                n,
                median(work),
                "s",
                target="< 0.2 s",
                ok=median(work) < 0.2,
                samples=work,
                command=cmd + "; the row above minus the import time of the same run",
            ),
            Row(
                "  first tick ('serving' -> claim)",
                n,
                median([r[1] for r in runs]),
                "s",
                samples=[r[1] for r in runs],
                command=cmd + "; 'serving' log line -> first claim",
            ),
        ]
    return rows


# -- machine, table, main ---------------------------------------------------------------


def machine(root: str, package: str) -> dict[str, Any]:
    mem_kb = 0
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    df = subprocess.run(["df", "-T", root], capture_output=True, text=True, check=False)
    lines = df.stdout.splitlines()
    fstype = lines[-1].split()[1] if len(lines) > 1 else "?"
    git = subprocess.run(
        ["git", "-C", package, "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    )
    return {
        "nproc": os.cpu_count(),
        "memory_gb": round(mem_kb / 1024 / 1024, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "filesystem": fstype,
        "loadavg": os.getloadavg()[0],
        "package": f"{package} ({git.stdout.strip() or 'not a git checkout'})",
    }


def _fmt(x: float | None) -> str:
    if x is None or math.isnan(x):
        return "-"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def table(rows: list[Row]) -> str:
    head = ("benchmark", "n", "value", "unit", "baseline", "ratio", "target", "ok", "runs")
    body = [
        (
            r.name,
            f"{r.n:,}",
            _fmt(r.value),
            r.unit,
            _fmt(r.baseline),
            _fmt(r.ratio),
            r.target or "",
            "" if r.ok is None else ("yes" if r.ok else "NO"),
            str(len(r.samples)),
        )
        for r in rows
    ]
    widths = [max(len(x[i]) for x in (head, *body)) for i in range(len(head))]
    right = {1, 2, 4, 5, 8}

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    out = [line(head), line(["-" * w for w in widths]), *(line(b) for b in body)]
    out.append("")
    out.append("baselines (same run) and commands:")
    seen = set()
    for r in rows:
        if r.baseline_name and r.baseline_name not in seen:
            seen.add(r.baseline_name)
            out.append(f"  baseline: {r.baseline_name}")
    for r in rows:
        out.append(f"  {r.name.strip()} (n={r.n:,}): {r.command}")
    return "\n".join(out)


def find_flow() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "flow")
    found = beside if os.access(beside, os.X_OK) else shutil.which("flow")
    if not found:
        sys.exit("benchmarks: no `flow` command beside this python or on PATH; pass --flow")
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    ap.add_argument("--json", metavar="OUT", help="also write the rows as JSON here")
    ap.add_argument(
        "--only", action="append", choices=list(BENCHMARKS), help="run only these (repeatable)"
    )
    ap.add_argument("--flow", default=None, help="the flow command (default: beside python)")
    ap.add_argument(
        "--package",
        metavar="DIR",
        help="benchmark the httk_flow in this source tree instead of the installed one",
    )
    ap.add_argument("--tmpdir", default=None, help="build workspaces under this directory")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument(
        "--cprofile", metavar="FILE", help="also run the e2e workload once under cProfile"
    )
    args = ap.parse_args(argv)

    profile = PROFILES[args.profile]
    root = tempfile.mkdtemp(prefix="flow-bench-", dir=args.tmpdir)
    flow = args.flow or find_flow()
    bench = Bench(
        profile,
        root,
        flow,
        cprofile=args.cprofile and os.path.abspath(args.cprofile),
        package=args.package and os.path.abspath(args.package),
    )
    info = machine(root, os.path.abspath(args.package) if args.package else REPO)
    bench.say(f"profile {profile.name} under {root}; machine {info}")
    rows: list[Row] = []
    errors: dict[str, str] = {}
    t0 = time.monotonic()
    try:
        for name in args.only or list(BENCHMARKS):
            try:
                rows += BENCHMARKS[name](bench)
            except BenchError as e:
                errors[name] = str(e)
                bench.say(f"{name} FAILED: {e}")
    finally:
        if args.keep:
            bench.say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    info["loadavg_end"] = os.getloadavg()[0]
    info["seconds"] = round(time.monotonic() - t0, 1)
    print(table(rows))
    print(
        f"\n{info['nproc']} CPUs, {info['memory_gb']} GB, Python {info['python']}, "
        f"{info['filesystem']}, package {info['package']}, load {info['loadavg']:.2f} -> "
        f"{info['loadavg_end']:.2f}, {info['seconds']}s"
    )
    for name, err in errors.items():
        print(f"FAILED {name}: {err}")
    if args.json:
        doc = {
            "profile": profile.name,
            "machine": info,
            "rows": [r.to_json() for r in rows],
            "errors": errors,
        }
        with open(args.json, "wb") as fh:
            fh.write(json.dumps(doc, indent=2).encode() + b"\n")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
