"""Issue #18: the bash API's job side, launcher included, in instructions (callgrind).

    python benchmarks/job_side.py [--tree DIR ...] [--loop 2000] [--direct 5] [--tmp DIR]

A real `flow run` attempt of a program that copies its /proc/PID/environ and cmdline
gives the exact environment and argv the manager hands bash (BASH_ENV=/dev/fd/9 and the
gate's variables among them). That start is then replayed under `valgrind
--tool=callgrind` as the manager makes it: the gate file of each tree on descriptor 9, the
gate (a pipe already holding its line) on stdin, the attempt's files removed before each
run. Counted, per tree:

- bare: `bash empty.sh` in the attempt's environment without the gate's variables;
- gate: the same with the gate (BASH_ENV and its variables), the program still empty;
- job: the gate and the standard no-op program (source flow.sh, flow_succeed).

Instruction counts are stable on a loaded machine, wall time is not. Two rates turn them
into time. The bare rate, the CPU time (user+system) of bare `bash empty.sh` run --loop
times over its instructions, is an upper bound: most of a bare run's CPU is the kernel's
exec and page faults, which extra instructions do not add. --direct ROUNDS also times bare,
gate and job interleaved and gives the marginal rate, (job CPU - bare CPU) / (job
instructions - bare instructions): the one to quote for "ms above bare" (it includes the
kernel's side of the files the gate and the outcome create).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from programs import FLOW_API1  # the standard no-op bash-API program

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAPTURE = """#!/usr/bin/env bash
cat /proc/$$/environ >"$CAPTURE_DIR/environ"
cat /proc/$$/cmdline >"$CAPTURE_DIR/cmdline"
source "$FLOW_BASH_API"
flow_steps main
step_main() { flow_succeed; }
flow_main "$@"
"""
GATE_VARS = ("BASH_ENV", "FLOW_LAUNCH_CONTEXT", "_FLOW_GATE_")


def flow(tmp: str, *args: str, env: dict[str, str]) -> None:
    cmd = [sys.executable, "-P", "-m", "httk_flow", "-w", os.path.join(tmp, "ws"), *args]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)


def capture(tmp: str) -> tuple[dict[str, str], list[str]]:
    """The environment and argv bash got from a real attempt."""
    prog = os.path.join(tmp, "capture.sh")
    with open(prog, "w") as fh:
        fh.write(CAPTURE)
    os.chmod(prog, 0o755)
    env = {**os.environ, "PYTHONPATH": REPO, "CAPTURE_DIR": tmp}
    os.makedirs(os.path.join(tmp, "ws"))
    flow(tmp, "init", os.path.join(tmp, "ws"), env=env)
    flow(tmp, "submit", prog, env=env)
    flow(tmp, "run", "--workers", "1", env=env)
    with open(os.path.join(tmp, "environ"), "rb") as fh:
        raw = fh.read().split(b"\0")
    got = dict(e.decode().split("=", 1) for e in raw if e)
    with open(os.path.join(tmp, "cmdline"), "rb") as fh:
        argv = [a.decode() for a in fh.read().split(b"\0") if a]
    if "BASH_ENV" not in got:
        sys.exit("the attempt was not started by the bash launcher")
    return got, argv


def replay(
    env: dict[str, str], bash: str, prog: str, gate: str | None, valgrind: bool
) -> subprocess.CompletedProcess[bytes]:
    """One start of bash on prog as the manager makes it (gate: the file on fd 9)."""
    for name in ("FLOW_CONTROL_DIR", "FLOW_WORKDIR"):
        os.makedirs(env[name], exist_ok=True)
    for name in ("outcome.line", "context.json", "stdout", "stderr", "exec.failed"):
        try:
            os.unlink(os.path.join(env["FLOW_CONTROL_DIR"], name))
        except FileNotFoundError:
            pass
    argv = [bash, prog]
    if valgrind:
        argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv]
    r, w = os.pipe()
    os.write(w, b"go\n")
    os.close(w)
    fd = os.open(gate or os.devnull, os.O_RDONLY)
    try:
        os.dup2(fd, 9, inheritable=True)
        return subprocess.run(
            argv, stdin=r, env=env, pass_fds=(9,), capture_output=True, cwd=env["FLOW_WORKDIR"]
        )
    finally:
        os.close(r)
        os.close(fd)
        os.close(9)


def instructions(env: dict[str, str], bash: str, prog: str, gate: str | None) -> int:
    done = replay(env, bash, prog, gate, valgrind=True)
    found = re.search(rb"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        sys.exit(f"callgrind run failed ({done.returncode}): {done.stderr[-2000:]!r}")
    return int(found.group(1))


def timed(
    n: int, env: dict[str, str], bash: str, prog: str, gate: str | None
) -> tuple[float, float]:
    """CPU (user+system) and wall seconds per run of n runs in a row."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    for _ in range(n):
        replay(env, bash, prog, gate, valgrind=False)
    wall = (time.perf_counter() - t0) / n
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return cpu / n, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", action="append", help="source trees to count (default: this one)")
    ap.add_argument("--loop", type=int, default=2000, help="runs timed for each rate")
    ap.add_argument(
        "--direct",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="also time bare, gate and job directly, ROUNDS rounds of --loop/ROUNDS "
        "runs each, interleaved (CPU differences; noisy on a loaded machine)",
    )
    ap.add_argument("--tmp", help="directory for the workspace (default: a new temporary one)")
    a = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("needs valgrind")
    tmp = tempfile.mkdtemp(prefix="job-side-", dir=a.tmp)
    env, argv = capture(tmp)
    bash = argv[0]
    bare_env = {k: v for k, v in env.items() if not k.startswith(GATE_VARS)}
    empty = os.path.join(tmp, "empty.sh")
    noop = os.path.join(tmp, "noop.sh")
    for path, text in ((empty, "#!/usr/bin/env bash\n"), (noop, FLOW_API1)):
        with open(path, "w") as fh:
            fh.write(text)
        os.chmod(path, 0o755)
    bare = instructions(bare_env, bash, empty, None)
    cpu, wall = timed(a.loop, bare_env, bash, empty, None)
    per_m = cpu * 1e3 / (bare / 1e6)  # ms per million instructions
    print(
        f"bare `bash empty.sh`: {bare:,} instructions; {cpu * 1e3:.3f} ms CPU, "
        f"{wall * 1e3:.3f} ms wall per run ({a.loop} runs): {per_m:.4f} ms per M (the bare rate)"
    )
    sides = []
    for tree in a.tree or [REPO]:
        tree = os.path.abspath(tree)
        tenv = {**env, "FLOW_BASH_API": os.path.join(tree, "shell", "flow.sh")}
        gate_file = os.path.join(tree, "shell", "flow-gate.sh")
        gate = instructions(tenv, bash, empty, gate_file)
        job = instructions(tenv, bash, noop, gate_file)
        done = replay(tenv, bash, noop, gate_file, valgrind=False)
        with open(os.path.join(env["FLOW_CONTROL_DIR"], "outcome.line")) as fh:
            line = fh.read()
        if done.returncode != 0 or line != '{"action":"succeed","message":""}\n':
            sys.exit(f"{tree}: the no-op job did not publish its outcome: {line!r}")
        print(
            f"{tree}: gate {gate:,} (+{(gate - bare) / 1e6:.2f} M, "
            f"{(gate - bare) / 1e6 * per_m:.3f} ms); job {job:,} "
            f"(+{(job - bare) / 1e6:.2f} M above bare, {(job - bare) / 1e6 * per_m:.3f} ms; "
            f"flow.sh and flow_succeed +{(job - gate) / 1e6:.2f} M)"
        )
        sides.append((tree, tenv, gate_file, job))
    if a.direct:
        # each round times bare and every tree's gate and job, so a change of load
        # between rounds moves all of them alike
        n = max(1, a.loop // a.direct)
        rounds = []
        for _ in range(a.direct):
            base = timed(n, bare_env, bash, empty, None)[0]
            rounds.append(
                [
                    (
                        timed(n, tenv, bash, empty, gate_file)[0] - base,
                        timed(n, tenv, bash, noop, gate_file)[0] - base,
                    )
                    for _, tenv, gate_file, _ in sides
                ]
            )
        for i, (tree, _, _, job) in enumerate(sides):
            dg = statistics.median(r[i][0] for r in rounds) * 1e3
            dj = statistics.median(r[i][1] for r in rounds) * 1e3
            print(
                f"{tree}: measured CPU above bare (median of {a.direct} rounds of {n}): gate "
                f"{dg:.3f} ms, job {dj:.3f} ms; "
                f"{dj / ((job - bare) / 1e6):.4f} ms per M (the marginal rate)"
            )
    if not a.tmp:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
