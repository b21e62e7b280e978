"""The reference engine (httk-workflow 2.1.1) and HyperQueue: found, installed, driven.

The reference needs Python 3.12 or newer. find_reference_python looks, in order, at
--reference-python, then python3.12 and python3.13 on PATH, then the installations under
pyenv's versions/ directory (`$PYENV_ROOT`, else `pyenv root`, else ~/.pyenv; 3.12 first,
then newer). Every candidate is run once to check its version and that it has venv. The
reference and HyperQueue (PyPI `hyperqueue`: server and worker in its wheel) are installed
with pip into a virtual environment under the benchmark's temporary directory; the
reference runs with HOME and XDG_* pointing there, so its per-user registry of workspaces
is thrown away with it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from harness import (
    Bench,
    BenchError,
    bytecode,
    run_checked,
    stop,
)
from programs import runners

REFERENCE_SPEC = "httk-workflow==2.1.1"
HYPERQUEUE_SPEC = "hyperqueue"

REF_SUBMIT_SCRIPT = """
import json, sys
from httk.workflow import Workspace
from httk.workflow.scaffold import new_jobs

ws = Workspace(sys.argv[1], durable=sys.argv[4] == "1")
n = int(sys.argv[3])
params = json.loads(sys.argv[5]) if len(sys.argv) > 5 else None
items = ({"placement": f"jobs/{i % 256:02x}"} for i in range(n))
count, first = 0, []
for job in new_jobs(ws, sys.argv[2], items, parameters=params, step="main"):
    count += 1
    if len(first) < 3:
        first.append(job.job_id)
print(json.dumps({"count": count, "first": first}))
"""

HQ_SCRIPT = """
import json, sys, time
t0 = time.perf_counter()
from hyperqueue import Job
from hyperqueue.cluster import LocalCluster, WorkerConfig

# N SERVER_DIR TASK_DIR PROGRAM...: N tasks running PROGRAM (in the submitting directory);
# TASK_DIR "1" gives each task a directory of its own (HQ_TASK_DIR, removed when it ends)
n, server_dir, task_dir, program = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1", sys.argv[4:]
with LocalCluster(server_dir=server_dir) as cluster:
    cluster.start_worker(WorkerConfig(cores=2))
    client = cluster.client()
    t1 = time.perf_counter()
    job = Job()
    for _ in range(n):
        job.program(program, task_dir=task_dir)
    submitted = client.submit(job)
    t2 = time.perf_counter()
    ok = client.wait_for_jobs([submitted], raise_on_error=False)
    t3 = time.perf_counter()
print(json.dumps({"ok": ok, "start": t1 - t0, "submit": t2 - t1, "run": t3 - t2}))
"""


# -- finding a Python for the reference, installing it ----------------------------------


def _python_ok(path: str) -> str | None:
    """The version of the interpreter at path if it runs and is 3.12 or newer, else None."""
    try:
        p = subprocess.run(
            [path, "-c", "import sys, venv; print('%d.%d.%d' % sys.version_info[:3])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except OSError:
        return None
    version = p.stdout.strip()
    if p.returncode != 0 or not version:
        return None
    major, minor = (int(x) for x in version.split(".")[:2])
    return version if (major, minor) >= (3, 12) else None


def _pyenv_root() -> str:
    if os.environ.get("PYENV_ROOT"):
        return os.environ["PYENV_ROOT"]
    if shutil.which("pyenv"):
        p = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=False)
        if p.returncode == 0 and p.stdout.strip():
            return p.stdout.strip()
    return os.path.expanduser("~/.pyenv")


def _version_key(name: str) -> tuple[int, ...]:
    out = []
    for part in name.split("."):
        digits = "".join(c for c in part if c.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def reference_python_candidates(explicit: str | None) -> list[tuple[str, str]]:
    """(path, how it was found), in the order they are tried."""
    if explicit:
        return [(explicit, "--reference-python")]
    out = []
    for name in ("python3.12", "python3.13"):
        found = shutil.which(name)
        if found:
            out.append((found, f"{name} on PATH"))
    versions = os.path.join(_pyenv_root(), "versions")
    if os.path.isdir(versions):
        names = [v for v in os.listdir(versions) if v[:1].isdigit()]
        # 3.12 first (the reference's documented version), then newer ones
        for v in sorted(names, key=lambda v: (_version_key(v)[:2] != (3, 12), _version_key(v))):
            if _version_key(v)[:2] >= (3, 12):
                mm = ".".join(v.split(".")[:2])
                for exe in (f"python{mm}", "python3"):
                    path = os.path.join(versions, v, "bin", exe)
                    if os.access(path, os.X_OK):
                        out.append((path, "a pyenv installation"))
                        break
    return out


def find_reference_python(explicit: str | None) -> tuple[str, str, str]:
    """(interpreter, its version, how it was found); BenchError when none will do."""
    tried = []
    for path, how in reference_python_candidates(explicit):
        version = _python_ok(path)
        if version:
            return path, version, how
        tried.append(f"{path} ({how})")
    raise BenchError(
        "the reference (httk-workflow) needs Python 3.12 or newer and none was found; "
        "pass --reference-python PATH"
        + (f" (tried, not usable: {', '.join(tried)})" if tried else "")
    )


def _pip_install(b: Bench, python: str, spec: str) -> str | None:
    """Install spec with pip; None on success, else the tail of pip's error output."""
    p = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", spec],
        capture_output=True,
        text=True,
        cwd=b.root,
        check=False,
    )
    if p.returncode == 0:
        return None
    lines = [x for x in (p.stderr + p.stdout).splitlines() if x.strip()]
    return " | ".join(lines[-4:]) or f"pip exited {p.returncode}"


def _installed_version(python: str, dist: str) -> str | None:
    p = subprocess.run(
        [python, "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return p.stdout.strip() if p.returncode == 0 else None


def _name(ws: str) -> str:
    """The reference's CLI takes registered workspace names, not paths: init registers the
    basename (unique here, every workspace is made by Bench.path)."""
    return os.path.basename(ws)


class Reference:
    """httk-workflow installed in its own virtual environment, driven by its CLI and API."""

    def __init__(
        self, b: Bench, venv: str, *, poll: float, found: str, python_version: str
    ) -> None:
        self.b = b
        self.venv = venv
        self.python = os.path.join(venv, "bin", "python")
        self.httk = os.path.join(venv, "bin", "httk")
        self.poll = poll
        self.found = found
        self.python_version = python_version
        self.version = _installed_version(self.python, "httk-workflow") or "?"
        self.hq_version = _installed_version(self.python, "hyperqueue")
        self.hq_error: str | None = None
        home = b.path("reference-home")
        os.makedirs(home)
        drop = ("FLOW_", "HTTK_", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
        self.env.update(
            HOME=home,
            XDG_CONFIG_HOME=os.path.join(home, ".config"),
            XDG_DATA_HOME=os.path.join(home, ".local", "share"),
            XDG_STATE_HOME=os.path.join(home, ".local", "state"),
            XDG_CACHE_HOME=os.path.join(home, ".cache"),
            PATH=os.pathsep.join([os.path.join(venv, "bin"), os.environ.get("PATH", "")]),
        )
        bytecode(self.env, os.path.join(b.root, "pycache"))
        self._fixtures: dict[int, str] = {}

    def describe(self) -> dict[str, Any]:
        return {
            "reference": f"httk-workflow {self.version}",
            "reference_python": f"{self.python_version} ({self.found})",
            "reference_poll_interval": self.poll,
            "hyperqueue": self.hq_version or f"not available: {self.hq_error}",
        }

    # -- commands --

    def sh(self, argv: Sequence[str], *, capture: bool = False, cwd: str | None = None) -> str:
        return run_checked(argv, env=self.env, cwd=cwd or self.b.root, capture=capture)

    def durability(self, durable: bool) -> str:
        return "--durable" if durable else "--no-durable"

    def init(self, label: str, *, durable: bool = False) -> str:
        ws = self.b.path(f"ref-{label}")
        # the per-user registry names workspaces by basename: b.path makes it unique
        self.sh([self.httk, "workspace", "init", self.durability(durable), ws])
        return ws

    def submit_argv(self, ws: str, runner: str, n: int, durable: bool, params: dict[str, Any]):
        return [self.python, "-c", REF_SUBMIT_SCRIPT, ws, runner, str(n), str(int(durable))] + (
            [json.dumps(params)] if params else []
        )

    def submit(
        self, ws: str, runner: str, n: int, *, durable: bool, params: dict[str, Any] | None = None
    ) -> tuple[float, list[str]]:
        """(wall seconds of one process submitting n jobs, the first job ids)."""
        argv = self.submit_argv(ws, runner, n, durable, params or {})
        t0 = time.perf_counter()
        out = self.sh(argv, capture=True)
        secs = time.perf_counter() - t0
        doc = json.loads(out.strip().splitlines()[-1])
        if doc["count"] != n:
            raise BenchError(f"the reference submitted {doc['count']} of {n} jobs in {ws}")
        return secs, doc["first"]

    def manager_argv(self, ws: str, *, workers: int = 2, durable: bool = False) -> list[str]:
        return [
            self.httk,
            "workflow",
            "run",
            "--workspace",
            _name(ws),
            "--inline",
            "--workers",
            str(workers),
            self.durability(durable),
            "--poll-interval",
            f"{self.poll:g}",
        ]

    def run(
        self, ws: str, *, expected: int, durable: bool = False, cap: float | None = None
    ) -> tuple[float, int, str]:
        """Run a manager until idle (or until cap seconds): (seconds, jobs succeeded, note)."""
        argv = [*self.manager_argv(ws, durable=durable), "--idle-timeout", "86400"]
        t0 = time.perf_counter()
        p = subprocess.Popen(
            argv,
            env=self.env,
            cwd=self.b.root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        note = ""
        try:
            p.wait(cap)
            secs = time.perf_counter() - t0
        except subprocess.TimeoutExpired:
            secs = time.perf_counter() - t0
            stop(p)
            note = f"stopped at the {cap:g}s cap"
        counts = self.counts(ws)
        done = counts.get("succeeded", 0)
        if done != expected:
            rest = {k: v for k, v in counts.items() if k != "succeeded" and v}
            note = "; ".join(
                filter(None, [note, f"{done} of {expected} succeeded", f"others: {rest}"])
            )
            if not done:
                raise BenchError(f"the reference ran no job to success in {ws}: {counts}")
        return secs, done, note

    def counts(self, ws: str) -> dict[str, int]:
        argv = [self.httk, "workspace", "status", "--json", _name(ws)]
        doc = json.loads(self.sh(argv, capture=True))
        if isinstance(doc, list):
            doc = doc[0]
        return {str(k): int(v) for k, v in doc.get("counts", {}).items()}

    def failure(self, ws: str, job_id: str) -> str:
        """The recorded failure of one job, as 'code: message'."""
        try:
            out = self.sh(
                [
                    self.httk,
                    "job",
                    "show",
                    "--workspace",
                    _name(ws),
                    "--no-children",
                    "--json",
                    job_id,
                ],
                capture=True,
            )
            doc = json.loads(out)
            doc = doc[0] if isinstance(doc, list) else doc
            f = doc.get("failure") or {}
            return f"{f.get('code')}: {f.get('message')}"
        except (BenchError, ValueError, KeyError, IndexError) as e:
            return f"(failure not readable: {e})"

    def warm_up(self) -> None:
        """One tiny workload before any clock starts (fills the bytecode cache)."""
        ws = self.init("warm-up")
        self.submit(ws, runners(self.b)["ref_hand"], 2, durable=False)
        self.run(ws, expected=2)
        self.sh([self.httk, "workspace", "status", _name(ws)])
        self.b.discard(ws)

    def ready_workspace(self, n: int) -> str:
        """n bash-SDK jobs registered to ready by a manager that can claim none of them."""
        if n not in self._fixtures:
            t0 = time.monotonic()
            ws = self.init(f"ready-{n}")
            secs, _ = self.submit(ws, runners(self.b)["ref_sdk_hold"], n, durable=False)
            argv = self.manager_argv(ws, workers=1)
            # a pool nobody submits to: the manager validates and registers every job, then
            # finds nothing claimable here and exits idle
            t1 = time.monotonic()
            self.sh([*argv, "--pool", "bench-nobody", "--idle-timeout", "86400"])
            reg = time.monotonic() - t1
            got = self.counts(ws).get("ready", 0)
            if got != n:
                raise BenchError(f"the reference registered {got} of {n} jobs in {ws}")
            self.b.say(
                f"fixture: reference, {n} ready jobs in {time.monotonic() - t0:.1f}s "
                f"(submitted at {n / secs:.0f} jobs/s, registered at {n / reg:.0f} jobs/s)"
            )
            self._fixtures[n] = ws
        return self._fixtures[n]


def setup_reference(
    b: Bench, *, python: str | None, venv: str | None, poll: float, hyperqueue: bool = True
) -> Reference:
    """Find a Python >= 3.12, make (or reuse) a venv, pip install the reference and HQ."""
    interp, version, how = find_reference_python(python)
    b.say(f"reference: Python {version} at {interp} ({how})")
    target = venv or os.path.join(b.root, "reference-venv")
    vpython = os.path.join(target, "bin", "python")
    want = REFERENCE_SPEC.split("==")[1]
    if not (os.access(vpython, os.X_OK) and _installed_version(vpython, "httk-workflow") == want):
        t0 = time.monotonic()
        p = subprocess.run(
            [interp, "-m", "venv", target], capture_output=True, text=True, check=False
        )
        if p.returncode != 0:
            raise BenchError(f"`{interp} -m venv {target}` failed: {p.stderr.strip()[-500:]}")
        err = _pip_install(b, vpython, REFERENCE_SPEC)
        if err:
            raise BenchError(f"pip install {REFERENCE_SPEC} failed: {err}")
        b.say(f"reference: installed {REFERENCE_SPEC} in {time.monotonic() - t0:.1f}s")
    hq_error = None
    if hyperqueue and _installed_version(vpython, "hyperqueue") is None:
        hq_error = _pip_install(b, vpython, HYPERQUEUE_SPEC)
        if hq_error:
            b.say(f"HyperQueue: pip install {HYPERQUEUE_SPEC} failed: {hq_error}")
    ref = Reference(b, target, poll=poll, found=how, python_version=version)
    ref.hq_error = hq_error
    if ref.hq_version is None and not ref.hq_error:
        ref.hq_error = "not installed" if hyperqueue else "skipped (--no-hyperqueue)"
    b.say(f"reference: {ref.describe()}")
    return ref
