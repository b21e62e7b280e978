"""Profiles of httk_flow's side of a benchmark (run.py --profile-to DIR).

For each e2e workload of the selected benchmarks (N jobs submitted, then `flow run
--workers 2 --quiet` to idle), four more runs on fresh workspaces, none of them timed as
a benchmark:

* a resource-usage run: the CLI runs in-process under RUSAGE_SCRIPT, which writes
  getrusage(RUSAGE_SELF) (the manager alone) and RUSAGE_CHILDREN at exit; the runner also
  takes os.wait4's rusage of the whole process (the manager plus every job it reaped).
  Job-side CPU = total - manager. The same is done for an empty workspace (the fixed cost
  of one manager start) and for the workload's floor (`seq N | xargs -P2 -n1 ./noop.sh`
  for bash jobs, `... sh -c true` for /bin/true jobs);
* py-spy recording the manager (`--format raw`: folded stacks, one line per distinct
  stack), from which the runner derives the functions with the most self and inclusive
  samples;
* `strace -c` without -f: the manager process alone (also on an empty workspace);
* `strace -f -c`: the manager and everything it starts.

Per-job figures are given all-in (the run's total over N) and marginal (the run's total
minus the empty workspace's run, over N: interpreter start-up is not spread over the
jobs). Files: DIR/<workload>.pyspy.folded, .pyspy.txt, .strace-manager.txt,
.strace-manager-empty.txt, .strace-all.txt, .rusage.json, and DIR/summary.md.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from compare import group_syscalls, strace_counts
from harness import Bench, BenchError, check_all_succeeded
from programs import runners
from reference import _pip_install
from scripts import RUSAGE_SCRIPT
from workloads import _count_entries, xargs_argv, xargs_script_argv

#: py-spy's sampling rate (its default is 100 Hz)
PYSPY_RATE = 200
#: functions listed in each top table of DIR/<workload>.pyspy.txt
TOP = 25
#: the target of the issue for the manager's own syscalls per job
MANAGER_SYSCALLS_PER_JOB = 60
#: the issue's job-side target: at most this many ms above a bare `bash script.sh`
JOB_SIDE_ABOVE_FLOOR_MS = 0.5


@dataclass(frozen=True)
class Workload:
    name: str
    #: a key of programs.runners(), or "true" (/bin/true found on PATH)
    program: str
    #: the floor whose CPU per job the job side is set beside
    floor: str  # "script" (./noop.sh) or "sh" (sh -c true)
    fanout: bool = False
    #: program runs per job (two-step: 2), so the floor runs as many times
    activations: int = 1


WORKLOADS = {
    w.name: w
    for w in (
        Workload("e2e-bash-api", "flow_api1", "script"),
        Workload("e2e-true", "true", "sh"),
        Workload("e2e-two-step", "flow_api2", "script", activations=2),
        Workload("e2e-fanout", "flow_fanout", "script", fanout=True),
    )
}

#: the workloads profiled for each benchmark (the httk_flow side of its e2e rows)
PROFILED = {
    "e2e": ("e2e-true",),
    "bash_api": ("e2e-bash-api",),
    "vs_e2e": ("e2e-bash-api", "e2e-true"),
    "vs_meta": ("e2e-bash-api",),
    "vs_two_step": ("e2e-two-step",),
    "vs_fanout": ("e2e-fanout",),
}
DEFAULT = ("e2e-bash-api", "e2e-true")


def workloads_for(names: Sequence[str]) -> list[str]:
    """The workloads to profile for these benchmarks (the two single-step ones if none)."""
    out = [w for n in names for w in PROFILED.get(n, ())]
    return list(dict.fromkeys(out)) or list(DEFAULT)


# -- tools ---------------------------------------------------------------------------------


def _runs(argv: list[str]) -> str | None:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def find_py_spy(b: Bench) -> tuple[str, str]:
    """(py-spy command, its version): the one on PATH if it runs, else installed from PyPI
    into a venv under the temporary directory; BenchError saying what to do otherwise."""
    found = shutil.which("py-spy")
    version = found and _runs([found, "--version"])
    if found and version:
        return found, version
    venv = os.path.join(b.root, "py-spy-venv")
    b.say("py-spy: none on PATH that runs; installing it from PyPI into " + venv)
    p = subprocess.run(
        [sys.executable, "-m", "venv", venv], capture_output=True, text=True, check=False
    )
    if p.returncode != 0:
        raise BenchError(f"--profile-to: cannot make a venv for py-spy: {p.stderr[-500:]}")
    err = _pip_install(b, os.path.join(venv, "bin", "python"), "py-spy")
    exe = os.path.join(venv, "bin", "py-spy")
    version = None if err else _runs([exe, "--version"])
    if not version:
        raise BenchError(
            "--profile-to needs py-spy: none on PATH runs and `pip install py-spy` failed "
            f"({err or 'the installed py-spy does not run'}); install it (pip install py-spy) "
            "and put it on PATH"
        )
    return exe, version


def _need_strace() -> str:
    version = _runs(["strace", "-V"])
    if not version:
        raise BenchError("--profile-to needs strace on PATH (e.g. apt-get install strace)")
    return version.splitlines()[0]


# -- runs --------------------------------------------------------------------------------


def _cpu(ru: Any) -> float:
    return float(ru.ru_utime + ru.ru_stime)


def _wait4(b: Bench, argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and the children it reaped) of one command."""
    t0 = time.perf_counter()
    p = subprocess.Popen(
        argv,
        env=b.env,
        cwd=b.root,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert p.stderr is not None
    err = p.stderr.read()  # until it exits (its stderr closes)
    p.stderr.close()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        tail = err.decode(errors="replace").strip()[-2000:]
        raise BenchError(f"`{shlex.join(argv)}` exited {p.returncode}: {tail}")
    return wall, _cpu(ru)


class _Runner:
    def __init__(self, b: Bench, w: Workload, n: int, outdir: str, py_spy: str) -> None:
        self.b, self.w, self.n, self.outdir, self.py_spy = b, w, n, outdir, py_spy
        progs = runners(b)
        self.program = "true" if w.program == "true" else progs[w.program]
        self.floor_script = progs["noop"]
        self.jobs = n + 1 if w.fanout else n
        #: program runs: a fan-out's parent runs twice (main, then collect)
        self.runs = n + 2 if w.fanout else n * w.activations

    def out(self, suffix: str) -> str:
        return os.path.join(self.outdir, f"{self.w.name}.{suffix}")

    def workspace(self, submit: bool = True) -> str:
        b = self.b
        ws = b.init(f"prof-{self.w.name}-{self.n if submit else 0}")
        if not submit:
            return ws
        if self.w.fanout:
            argv = [b.flow, "-w", ws, "submit", "--param", f"children={self.n}", self.program]
        else:
            argv = [b.flow, "-w", ws, "submit", "--array", f"1-{self.n}", self.program]
        b.sh(argv)
        return ws

    def run_argv(self, ws: str) -> list[str]:
        return ["-w", ws, "run", "--workers", "2", "--quiet"]

    def rusage(self, submit: bool) -> dict[str, float]:
        """One run under RUSAGE_SCRIPT: wall, total, manager and children CPU, inodes."""
        b = self.b
        ws = self.workspace(submit)
        empty = _count_entries(ws)
        got = os.path.join(b.root, f"rusage-{self.w.name}.json")
        wall, total = _wait4(b, [b.python, "-c", RUSAGE_SCRIPT, got, *self.run_argv(ws)])
        with open(got) as fh:
            doc = json.load(fh)
        os.unlink(got)
        if submit:
            check_all_succeeded(b, ws, self.jobs)
        inodes = _count_entries(ws) - empty
        b.discard(ws)
        return {
            "wall_s": wall,
            "total_cpu_s": total,
            "manager_cpu_s": doc["self_cpu"],
            "children_cpu_s": doc["children_cpu"],
            "manager_maxrss_kb": doc["self_maxrss_kb"],
            "inodes": inodes,
        }

    def floor(self) -> dict[str, Any]:
        if self.w.floor == "script":
            argv, what = xargs_script_argv(self.runs, self.floor_script), "xargs -P2 -n1 ./noop.sh"
        else:
            argv, what = xargs_argv(self.runs, "sh"), "xargs -P2 -n1 sh -c true"
        wall, cpu = _wait4(self.b, argv)
        return {"what": f"seq {self.runs} | {what}", "wall_s": wall, "cpu_s": cpu}

    def pyspy(self) -> int:
        b = self.b
        ws = self.workspace()
        raw = self.out("pyspy.folded")
        argv = [self.py_spy, "record", "--format", "raw", "--rate", str(PYSPY_RATE)]
        argv += ["--output", raw, "--", b.flow, *self.run_argv(ws)]
        t0 = time.perf_counter()
        b.sh(argv)
        wall = time.perf_counter() - t0
        check_all_succeeded(b, ws, self.jobs)
        b.discard(ws)
        stacks = read_folded(raw)
        head = (
            f"py-spy record --format raw --rate {PYSPY_RATE} of `flow run --workers 2 --quiet` "
            f"on {self.n} {self.w.name} jobs ({self.jobs} jobs), {wall:.1f}s under py-spy; "
            f"samples while the manager was not idle (py-spy's default)"
        )
        with open(self.out("pyspy.txt"), "w") as fh:
            fh.write(top_functions(stacks, head))
        return sum(stacks.values())

    def strace(self, suffix: str, *, follow: bool, submit: bool = True) -> dict[str, int]:
        """syscall -> calls of one run under strace -c; "<name> errors" for the failed ones."""
        b = self.b
        ws = self.workspace(submit)
        path = self.out(suffix)
        argv = ["strace", *(["-f"] if follow else []), "-c", "-o", path, "--"]
        b.sh([*argv, b.flow, *self.run_argv(ws)])
        if submit:
            check_all_succeeded(b, ws, self.jobs)
        b.discard(ws)
        return {**strace_counts(path), **strace_errors(path)}


def strace_errors(path: str) -> dict[str, int]:
    """'<syscall> errors' -> failed calls, from an `strace -c` summary's errors column."""
    out = {}
    with open(path) as fh:
        for line in fh:
            parts = line.split()
            if len(parts) == 6 and parts[3].isdigit() and parts[4].isdigit():
                out[parts[-1] + " errors"] = int(parts[4])
    return out


def _calls(counts: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in counts.items() if not k.endswith(" errors")}


# -- py-spy's folded stacks ----------------------------------------------------------------

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def read_folded(path: str) -> Counter[str]:
    """stack (frames joined by ';', outermost first) -> samples, from py-spy --format raw."""
    stacks: Counter[str] = Counter()
    with open(path) as fh:
        for line in fh:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if stack and count.isdigit():
                stacks[stack] += int(count)
    return stacks


def function_of(frame: str) -> str:
    """'func (file.py:12)' -> 'func (file.py)': samples are summed over a function's lines."""
    m = _FRAME.match(frame.strip())
    return f"{m['func']} ({m['file']})" if m else frame.strip()


def top_functions(stacks: Counter[str], head: str, top: int = TOP) -> str:
    """The functions with the most self and the most inclusive samples, as percentages."""
    total = sum(stacks.values())
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    for stack, count in stacks.items():
        funcs = [function_of(f) for f in stack.split(";") if f]
        if not funcs:
            continue
        own[funcs[-1]] += count
        for f in set(funcs):  # once per stack, however deep the recursion
            incl[f] += count
    lines = [head, f"{total} samples", ""]
    for title, counts in (("self", own), ("inclusive (self + callees)", incl)):
        lines.append(f"top {top} functions by {title} samples:")
        lines.append(f"  {'%':>6}  {'samples':>8}  function (file)")
        for func, c in counts.most_common(top):
            lines.append(f"  {100 * c / max(total, 1):6.2f}  {c:8d}  {func}")
        lines.append("")
    return "\n".join(lines)


# -- the whole profile ------------------------------------------------------------------------


def profile(b: Bench, names: Sequence[str], outdir: str, jobs: int | None = None) -> str:
    """Profile the workloads of these benchmarks into outdir; returns summary.md's text."""
    strace_v = _need_strace()
    py_spy, py_spy_v = find_py_spy(b)
    os.makedirs(outdir, exist_ok=True)
    n = jobs or b.profile.e2e_jobs
    load0 = os.getloadavg()[0]
    results: dict[str, dict[str, Any]] = {}
    for name in workloads_for(names):
        w = WORKLOADS[name]
        r = _Runner(b, w, n, outdir, py_spy)
        t0 = time.monotonic()
        res: dict[str, Any] = {"n": n, "jobs": r.jobs, "runs": r.runs}
        res["run"] = r.rusage(submit=True)
        res["empty"] = r.rusage(submit=False)
        res["floor"] = r.floor()
        res["pyspy_samples"] = r.pyspy()
        res["manager"] = r.strace("strace-manager.txt", follow=False)
        res["manager_empty"] = r.strace("strace-manager-empty.txt", follow=False, submit=False)
        res["all"] = r.strace("strace-all.txt", follow=True)
        res["figures"] = figures(res)
        with open(r.out("rusage.json"), "w") as fh:
            json.dump({k: v for k, v in res.items() if k not in ("manager", "all")}, fh, indent=2)
        results[name] = res
        b.say(f"profile {name}: {n} jobs in {time.monotonic() - t0:.1f}s -> {outdir}")
    text = summary(
        b, results, load0, tools=f"{py_spy_v} (rate {PYSPY_RATE} Hz), {strace_v}", outdir=outdir
    )
    with open(os.path.join(outdir, "summary.md"), "w") as fh:
        fh.write(text)
    return text


def _total(counts: dict[str, int]) -> int:
    return sum(_calls(counts).values())


def figures(res: dict[str, Any]) -> dict[str, float]:
    """Per-job figures of one workload (ms and calls per job; marginal = minus the empty run)."""
    jobs = res["jobs"]
    run, empty, floor = res["run"], res["empty"], res["floor"]
    mgr_calls, mgr_empty, all_calls = (
        _total(res["manager"]),
        _total(res["manager_empty"]),
        _total(res["all"]),
    )
    job_cpu = run["total_cpu_s"] - run["manager_cpu_s"]
    f = {
        "jobs/s": jobs / run["wall_s"],
        "manager CPU ms/job": 1000 * (run["manager_cpu_s"] - empty["manager_cpu_s"]) / jobs,
        "manager CPU ms/job, all-in": 1000 * run["manager_cpu_s"] / jobs,
        "job-side CPU ms/job": 1000 * job_cpu / jobs,
        "floor CPU ms/job": 1000 * floor["cpu_s"] / jobs,
        "program runs/job": res["runs"] / jobs,
        "manager syscalls/job": (mgr_calls - mgr_empty) / jobs,
        "manager syscalls/job, all-in": mgr_calls / jobs,
        "total syscalls/job": (all_calls - mgr_empty) / jobs,
        "total syscalls/job, all-in": all_calls / jobs,
        "job-side syscalls/job": (all_calls - mgr_calls) / jobs,
        "manager metadata syscalls/job": group_syscalls(res["manager"], jobs)["metadata"]
        - group_syscalls(res["manager_empty"], jobs)["metadata"],
        "total metadata syscalls/job": group_syscalls(res["all"], jobs)["metadata"]
        - group_syscalls(res["manager_empty"], jobs)["metadata"],
        "execve/job": group_syscalls(res["all"], jobs)["execve"],
        "failed execve/job": res["all"].get("execve errors", 0) / jobs,
        "inodes/job": run["inodes"] / jobs,
    }
    f["job side above floor, CPU ms/job"] = f["job-side CPU ms/job"] - f["floor CPU ms/job"]
    return f


#: (figure, how it is made) in the order of summary.md's table
ROWS = (
    ("jobs/s", "unprofiled run (the rusage run): jobs / wall seconds of `flow run`"),
    ("manager CPU ms/job", "manager's own user+sys CPU (getrusage SELF), minus an empty run's"),
    ("manager CPU ms/job, all-in", "the same, interpreter start-up included"),
    ("job-side CPU ms/job", "wait4 total of `flow run` (all reaped children) - the manager's"),
    ("program runs/job", "how often the job's program runs (two-step: 2)"),
    ("floor CPU ms/job", "wait4 total of the floor command, run as often (see below)"),
    ("job side above floor, CPU ms/job", "job-side - floor"),
    ("manager syscalls/job", "strace -c (no -f) of the manager, minus an empty run's"),
    ("manager syscalls/job, all-in", "the same, start-up included"),
    ("manager metadata syscalls/job", "rename, open/create, stat family, fsync, mkdir, unlink"),
    ("total syscalls/job", "strace -f -c (manager + jobs), minus the manager's empty run"),
    ("total syscalls/job, all-in", "the same, start-up included"),
    ("job-side syscalls/job", "strace -f total - the manager's (no -f) total"),
    ("total metadata syscalls/job", "as vs_meta's categories, strace -f, minus the empty run"),
    ("execve/job", "execve calls under strace -f, per job"),
    ("failed execve/job", "of those, failed ones (a command looked up along PATH)"),
    ("inodes/job", "entries left under the workspace after the run, per job"),
)


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.2f}" if abs(x) >= 1 else f"{x:.3f}"


def _check(name: str, workload: str, f: dict[str, float]) -> str:
    if name == "manager syscalls/job":
        ok = f[name] <= MANAGER_SYSCALLS_PER_JOB
        return f" (target <= {MANAGER_SYSCALLS_PER_JOB}: {'ok' if ok else 'NO'})"
    if name == "job side above floor, CPU ms/job" and workload == "e2e-bash-api":
        ok = f[name] <= JOB_SIDE_ABOVE_FLOOR_MS
        return f" (target <= {JOB_SIDE_ABOVE_FLOOR_MS:g}: {'ok' if ok else 'NO'})"
    return ""


def summary(
    b: Bench, results: dict[str, dict[str, Any]], load0: float, *, tools: str, outdir: str
) -> str:
    names = list(results)
    lines = [
        "# httk_flow profiles: `flow run --workers 2 --quiet` to idle",
        "",
        f"profile {b.profile.name}; {os.cpu_count()} CPUs; Python {sys.version.split()[0]}; "
        f"load {load0:.2f} -> {os.getloadavg()[0]:.2f}; {tools}",
        "",
        "| figure | " + " | ".join(f"{n} (n={results[n]['jobs']:,})" for n in names) + " |",
        "| --- | " + " | ".join("---:" for _ in names) + " |",
    ]
    for name, _ in ROWS:
        cells = [
            _fmt(results[n]["figures"][name]) + _check(name, n, results[n]["figures"])
            for n in names
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "How each figure is made:", ""]
    lines += [f"* **{name}**: {how}" for name, how in ROWS]
    lines += [
        "* floors: " + "; ".join(f"{n}: `{results[n]['floor']['what']}`" for n in names),
        "* marginal figures subtract one `flow run` on an empty workspace (start-up, one "
        "scan, exit), so the per-job figure is what one more job costs",
        "",
        "Manager syscalls per job (strace -c without -f, minus the empty run), the top ten:",
        "",
    ]
    for n in names:
        res = results[n]
        diff = Counter(_calls(res["manager"]))
        diff.subtract(_calls(res["manager_empty"]))
        top = ", ".join(f"{k} {v / res['jobs']:.1f}" for k, v in diff.most_common(10) if v > 0)
        lines.append(f"* {n}: {top}")
    lines += ["", "Manager functions with the most self samples (py-spy), the top five:", ""]
    for n in names:
        stacks = read_folded(os.path.join(outdir, f"{n}.pyspy.folded"))
        own: Counter[str] = Counter()
        for stack, c in stacks.items():
            own[function_of(stack.split(";")[-1])] += c
        total = max(sum(stacks.values()), 1)
        top = "; ".join(f"{f} {100 * c / total:.1f}%" for f, c in own.most_common(5))
        lines.append(f"* {n} ({total} samples): {top}")
    lines += [
        "",
        "Files: <workload>.pyspy.folded (py-spy raw: folded stacks, for flamegraph.pl or "
        "speedscope), .pyspy.txt (top functions), .strace-manager.txt, "
        ".strace-manager-empty.txt, .strace-all.txt, .rusage.json.",
        "",
    ]
    return "\n".join(lines)
