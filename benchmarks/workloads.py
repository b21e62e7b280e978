"""One run of each engine on one workload: submission, run to idle, HyperQueue, floors."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from typing import Any

from compare import SIZES
from harness import Bench, BenchError, check_all_succeeded, proc_kb, stop
from programs import runners
from reference import HQ_SCRIPT, Reference
from scripts import FLOOR_SCRIPT


def _count_entries(path: str) -> int:
    n = 0
    for _, dirs, files in os.walk(path):
        n += len(dirs) + len(files)
    return n


# -- one run of each engine -------------------------------------------------------------


def flow_submit(b: Bench, n: int, *, durable: bool) -> float:
    ws = b.init(f"vs-submit-{n}", durable=durable)
    prog = runners(b)["flow_api1"]
    secs = b.timed([b.flow, "-w", ws, "submit", "--array", f"1-{n}", prog])
    b.discard(ws)
    return secs


def floor_submit(b: Bench, n: int, *, durable: bool) -> float:
    floor = b.path(f"floor-{n}")
    secs = b.timed([b.python, "-c", FLOOR_SCRIPT, floor, str(n), str(int(durable))])
    b.discard(floor)
    return secs


def ref_submit(b: Bench, n: int, *, durable: bool) -> float:
    ref: Reference = b.reference
    ws = ref.init(f"submit-{n}", durable=durable)
    secs, _ = ref.submit(ws, runners(b)["ref_sdk1"], n, durable=durable)
    b.discard(ws)
    return secs


def flow_workload(
    b: Bench,
    program: str,
    jobs: int,
    *,
    durable: bool = False,
    children: int | None = None,
    strace: str | None = None,
) -> tuple[float, dict[str, Any]]:
    """Submit and run to idle with 2 workers: (seconds of `flow run`, detail)."""
    label = os.path.splitext(os.path.basename(program))[0]
    ws = b.init(f"vs-{label}-{children or jobs}", durable=durable)
    empty = _count_entries(ws)
    if children is not None:
        submit = [b.flow, "-w", ws, "submit", "--param", f"children={children}", program]
        expected = children + 1
    else:
        submit = [b.flow, "-w", ws, "submit", "--array", f"1-{jobs}", program]
        expected = jobs
    run = [b.flow, "-w", ws, "run", "--workers", "2", "--quiet"]
    detail: dict[str, Any] = {}
    if strace:
        b.sh(["strace", "-f", "-c", "-o", strace + ".submit", "--", *submit])
        secs = b.timed(["strace", "-f", "-c", "-o", strace + ".run", "--", *run])
    else:
        b.sh(submit)
        secs = b.timed(run)
    check_all_succeeded(b, ws, expected)
    detail["inodes_per_job"] = (_count_entries(ws) - empty) / expected
    b.discard(ws)
    return secs, detail


def ref_workload(
    b: Bench,
    runner: str,
    jobs: int,
    *,
    durable: bool = False,
    params: dict[str, Any] | None = None,
    expected: int | None = None,
    strace: str | None = None,
) -> tuple[float, int, str, dict[str, Any]]:
    """Submit and run to idle: (seconds of the manager, jobs succeeded, note, detail)."""
    ref: Reference = b.reference
    label = f"{os.path.basename(runner)[:-3]}-{jobs}"
    ws = ref.init(label, durable=durable)
    empty = _count_entries(ws)
    expected = expected or jobs
    detail: dict[str, Any] = {}
    if strace:
        argv = ref.submit_argv(ws, runner, jobs, durable, params or {})
        out = ref.sh(["strace", "-f", "-c", "-o", strace + ".submit", "--", *argv], capture=True)
        first = json.loads(out.strip().splitlines()[-1])["first"]
        run = [*ref.manager_argv(ws, durable=durable), "--idle-timeout", "86400"]
        t0 = time.perf_counter()
        ref.sh(["strace", "-f", "-c", "-o", strace + ".run", "--", *run])
        secs = time.perf_counter() - t0
        done = ref.counts(ws).get("succeeded", 0)
        note = "" if done == expected else f"{done} of {expected} succeeded"
    else:
        _, first = ref.submit(ws, runner, jobs, durable=durable, params=params)
        secs, done, note = ref.run(ws, expected=expected, durable=durable, cap=ref_cap(b))
    if params and "children" in params and done != expected and first:
        note = "; ".join(filter(None, [note, f"parent: {ref.failure(ws, first[0])}"]))
    detail["inodes_per_job"] = (_count_entries(ws) - empty) / max(done, 1)
    b.discard(ws)
    return secs, done, note, detail


def ref_cap(b: Bench) -> float:
    return SIZES[b.profile.name].cap


def hq_run(b: Bench, n: int, script: str | None = None) -> tuple[float, dict[str, Any]]:
    """N HyperQueue tasks: `bash -c true`, or `./NAME` for a script copied in beforehand
    (each task then has a directory of its own, HQ_TASK_DIR, to write its outcome in)."""
    ref: Reference = b.reference
    d = b.path(f"hq-{n}")
    server = os.path.join(d, "server")
    os.makedirs(server)
    if script is None:
        program = ["0", "bash", "-c", "true"]
    else:
        shutil.copy2(script, d)
        program = ["1", "./" + os.path.basename(script)]
    t0 = time.perf_counter()
    argv = [ref.python, "-c", HQ_SCRIPT, str(n), server, *program]
    out = ref.sh(argv, capture=True, cwd=d)
    secs = time.perf_counter() - t0
    doc = json.loads(out.strip().splitlines()[-1])
    if not doc.get("ok"):
        raise BenchError(f"HyperQueue reported failed tasks for {n} no-op jobs ({program[1:]})")
    b.discard(d)
    return secs, {k: round(v, 3) for k, v in doc.items() if k != "ok"}


def xargs_argv(n: int, shell: str) -> list[str]:
    return ["sh", "-c", f"seq {n} | xargs -P2 -n1 {shell} -c true"]


def xargs_script_argv(n: int, script: str) -> list[str]:
    """`seq N | xargs -P2 -n1 ./NAME` in the script's directory: a bare script file's cost."""
    d, name = os.path.split(script)
    return ["sh", "-c", f"cd {shlex.quote(d)} && seq {n} | xargs -P2 -n1 ./{name}"]


def _need_reference(b: Bench) -> Reference:
    if b.reference is None:
        raise BenchError("this benchmark needs --with-reference")
    ref: Reference = b.reference
    return ref


def _hq_ok(b: Bench) -> bool:
    return b.reference is not None and b.reference.hq_version is not None


def _is_ref_serving(ev: dict[str, Any]) -> bool:
    return ev.get("event") == "manager_started"


def _is_ref_claim(ev: dict[str, Any]) -> bool:
    return ev.get("event") == "transition" and ev.get("kind") == "claimed"


def _peak_rss(
    b: Bench,
    argv: list[str],
    env: dict[str, str],
    secs: float,
    claimed: Callable[[dict[str, Any]], bool],
) -> tuple[float, float]:
    """(VmHWM in MB, seconds to the first claim): the manager serves secs past its first claim.

    Waiting for the first claim first makes sure a manager that scans its whole backlog
    before claiming (the reference does) has done so before its peak is read.
    """
    log = b.path("manager-log")
    with open(log, "wb") as err:
        p = subprocess.Popen(
            argv,
            env=env,
            cwd=b.root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    t0 = time.perf_counter()
    try:
        seen = 0
        claim_at = None
        with open(log, "rb") as fh:
            while claim_at is None:
                if p.poll() is not None:
                    raise BenchError(f"`{shlex.join(argv)}` exited early with {p.returncode}")
                if time.perf_counter() - t0 > 600:
                    raise BenchError(f"`{shlex.join(argv)}` claimed nothing in 600s")
                fh.seek(seen)
                chunk = fh.read()
                cut = chunk.rfind(b"\n") + 1
                seen += cut
                for line in chunk[:cut].splitlines():
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(ev, dict) and claimed(ev):
                        claim_at = time.perf_counter() - t0
                        break
                else:
                    time.sleep(0.05)
        time.sleep(secs)
        if p.poll() is not None:
            raise BenchError(f"`{shlex.join(argv)}` exited early with {p.returncode}")
        peak = proc_kb(p.pid, "VmHWM")
    finally:
        stop(p, timeout=30)
        b.discard(log)
    return peak / 1024, claim_at


def _flow_claim(ev: dict[str, Any]) -> bool:
    return ev.get("event") == "transition" and ev.get("to") == "claimed"
