"""The benchmark harness: profiles, rows, the bench context, the registry and the table.

solo.py registers the httk_flow-only benchmarks here (compare.py holds the registry of
comparisons with the reference); run.py is the command line.
"""

from __future__ import annotations

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
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from scripts import REGISTER_SCRIPT

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
    #: "higher" when a bigger value is better (rates), "lower" for times, sizes and counts
    better: str = "higher"
    #: the baseline's job count where it differs from n (a slow peer run on fewer jobs)
    baseline_n: int | None = None
    #: cost at this n over cost at n / 10 (time, for a rate), of the value and of the baseline
    growth: float | None = None
    baseline_growth: float | None = None
    note: str = ""
    #: further figures behind the row (a syscall split, a peer's own timings)
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        pairs = list(zip(self.samples, self.baseline_samples, strict=False))
        if pairs and len(pairs) == len(self.samples) and all(b for _, b in pairs):
            return median([v / b for v, b in pairs])
        if self.baseline is None or self.baseline == 0:
            return None
        return self.value / self.baseline

    @property
    def advantage(self) -> float | None:
        """How many times better the value is than the baseline: ratio, or 1 / ratio for costs."""
        r = self.ratio
        if r is None or r == 0 or math.isnan(r):
            return None
        return r if self.better == "higher" else 1 / r

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
        if self.baseline is not None and self.better != "higher":
            out.update(better=self.better, advantage=self.advantage)
        elif self.baseline is not None:
            out.update(advantage=self.advantage)
        for key in ("baseline_n", "growth", "baseline_growth"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.note:
            out["note"] = self.note
        if self.detail:
            out["detail"] = self.detail
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
        bytecode(self.env, os.path.join(root, "pycache"))
        if package:
            # put another source tree (e.g. `git archive` of a commit) ahead of the installed one
            self.env["PYTHONPATH"] = os.pathsep.join(
                [package, *filter(None, [self.env.get("PYTHONPATH")])]
            )
        self.started = time.monotonic()
        self._count = 0
        self._fixtures: dict[tuple[str, int, str], str] = {}
        #: the installed reference engine (versus.Reference), set up by --with-reference
        self.reference: Any = None

    def say(self, message: str) -> None:
        print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    def path(self, label: str) -> str:
        self._count += 1
        return os.path.join(self.root, f"{self._count:03d}-{label}")

    def sh(self, argv: Sequence[str], *, capture: bool = False) -> str:
        """Run a command to completion; BenchError naming it when it fails."""
        # cwd: not the caller's directory, since `python -c` imports from there first
        return run_checked(argv, env=self.env, cwd=self.root, capture=capture)

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

    def warm_up(self) -> None:
        """One tiny workload before any clock starts: fills the bytecode cache (see bytecode)."""
        ws = self.init("warm-up")
        self.sh([self.flow, "-w", ws, "submit", "--array", "1-2", "true"])
        self.sh([self.flow, "-w", ws, "run", "--workers", "2", "--quiet"])
        self.sh([self.flow, "-w", ws, "status"])
        self.discard(ws)

    def ready_workspace(self, n: int, program: str = "true") -> str:
        """A workspace holding n no-op jobs already registered to ready (built once per run)."""
        key = ("ready", n, program)
        if key not in self._fixtures:
            t0 = time.monotonic()
            ws = self.init(f"ready-{n}")
            self.sh([self.flow, "-w", ws, "submit", "--array", f"1-{n}", program])
            got = int(self.sh([self.python, "-c", REGISTER_SCRIPT, ws], capture=True))
            if got != n:
                raise BenchError(f"registered {got} of {n} jobs in {ws}")
            self.say(f"fixture: {n} ready jobs in {time.monotonic() - t0:.1f}s")
            self._fixtures[key] = ws
        return self._fixtures[key]


def bytecode(env: dict[str, str], cache: str) -> None:
    """Let every Python the benchmark starts cache its bytecode, under the temporary root.

    With PYTHONDONTWRITEBYTECODE set (some shells and CI images set it), a package installed
    in editable mode has no .pyc files and compiles every module at every start, while a
    pip-installed wheel (the reference) ships compiled: an unequal start. The cache prefix
    keeps the .pyc files out of the source tree; warm_up fills it before timing.
    """
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = cache


# -- the registry ---------------------------------------------------------------------

BenchFn = Callable[[Bench], list[Row]]


def registry(table: dict[str, BenchFn]) -> Callable[[str], Callable[[BenchFn], BenchFn]]:
    """A decorator factory that files benchmark functions in `table` by name."""

    def register(name: str) -> Callable[[BenchFn], BenchFn]:
        def add(fn: BenchFn) -> BenchFn:
            table[name] = fn
            return fn

        return add

    return register


BENCHMARKS: dict[str, BenchFn] = {}
benchmark = registry(BENCHMARKS)


def run_checked(
    argv: Sequence[str], *, env: dict[str, str], cwd: str, capture: bool = False
) -> str:
    """Run a command to completion (stdout captured if asked); BenchError when it fails."""
    p = subprocess.run(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=False,
    )
    if p.returncode != 0:
        err = p.stderr.decode(errors="replace").strip()[-2000:]
        raise BenchError(f"`{shlex.join(argv)}` exited {p.returncode}: {err}")
    return p.stdout.decode() if capture else ""


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def check_all_succeeded(b: Bench, ws: str, n: int) -> None:
    status = json.loads(b.sh([b.flow, "-w", ws, "status", "--json"], capture=True))
    done = status["counts"]["succeeded"]
    if done != n:
        raise BenchError(f"{done} of {n} jobs succeeded in {ws}: {status['counts']}")


# -- processes ---------------------------------------------------------------------------


def proc_kb(pid: int, field_name: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise BenchError(f"no {field_name} in /proc/{pid}/status")


def stop(p: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """SIGTERM (the manager drains), then SIGKILL if it does not exit within timeout."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def stray_kill(ws: str) -> int:
    """SIGKILL what still runs in ws (held attempts a killed or drained manager left behind).

    Only processes this benchmark started can be there: the workspace is its own.
    """
    killed = 0
    prefix = os.path.realpath(ws) + os.sep
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if (cwd + os.sep).startswith(prefix) and int(pid) != os.getpid():
            try:
                os.kill(int(pid), signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed


def _flow_serving(ev: dict[str, Any]) -> bool:
    return ev.get("event") == "info" and "serving" in str(ev.get("message", ""))


def _flow_claimed(ev: dict[str, Any]) -> bool:
    return ev.get("event") == "transition" and ev.get("to") == "claimed"


def first_claim(
    b: Bench,
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    serving: Callable[[dict[str, Any]], bool] = _flow_serving,
    claimed: Callable[[dict[str, Any]], bool] = _flow_claimed,
    stop_timeout: float = 60.0,
    linger: float = 0.0,
    timeout: float = 600.0,
) -> tuple[float, float]:
    """(seconds from spawn to the first claim logged, seconds from 'serving' to it).

    The manager logs one JSON object per line on stderr; `serving` and `claimed` pick the
    line that says it started serving and the first claim (httk_flow's by default). A
    manager that has claimed nothing after `timeout` seconds (an empty backlog) is killed.
    """
    t0 = time.perf_counter()
    p = subprocess.Popen(
        argv,
        env=env or b.env,
        cwd=b.root,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    watchdog = threading.Timer(timeout, p.kill)
    watchdog.start()
    served = None
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
            if served is None and serving(ev):
                served = now
            if claimed(ev):
                time.sleep(linger)  # let the claimed attempt launch before the stop signal
                return now, now - (served if served is not None else 0.0)
        raise BenchError(f"`{shlex.join(argv)}` claimed no job (exited, or killed at {timeout:g}s)")
    finally:
        watchdog.cancel()
        stop(p, stop_timeout)
        if p.stderr is not None:
            p.stderr.close()


# -- machine, table ---------------------------------------------------------------------


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
        "package": git.stdout.strip() or "not a git checkout",
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
