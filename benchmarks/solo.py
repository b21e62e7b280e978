"""httk_flow alone, each figure beside a baseline measured in the same run (no peer engine).

Registered in harness.BENCHMARKS; run.py runs them without --with-reference.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time

from harness import (
    Bench,
    BenchError,
    Row,
    benchmark,
    check_all_succeeded,
    first_claim,
    median,
    proc_kb,
    stop,
    stray_kill,
)
from programs import runners
from scripts import FLOOR_SCRIPT

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
        check_all_succeeded(b, ws, n)
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
            target=">= 0.5 x xargs",
            ok=ratio >= 0.5,
            samples=[r[0] for r in runs],
            baseline_samples=[r[1] for r in runs],
            command=f"flow submit --array 1-{n} true; time flow run --workers 2 --quiet  "
            f"# beside: time {xargs[2]}",
        )
    ]


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
        ws = b.ready_workspace(n, runners(b)["flow_hold"])
        argv = [b.flow, "-w", ws, "serve", "--workers", "2", "--quiet"]

        def once(argv: list[str] = argv, ws: str = ws) -> float:
            p = subprocess.Popen(
                argv, env=b.env, cwd=b.root, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
            )
            try:
                time.sleep(secs)
                if p.poll() is not None:
                    raise BenchError(f"`{shlex.join(argv)}` exited early with {p.returncode}")
                peak = proc_kb(p.pid, "VmHWM")  # just before signalling: the peak so far
            finally:
                stop(p, timeout=5)
                stray_kill(ws)
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
        check_all_succeeded(b, ws, n)
        b.discard(ws)
        return n / flow_s, n / xargs_s

    runs2 = b.repeat(f"api-runner n={n}", once)
    rate = median([r[0] for r in runs2])
    ratio2 = median([r[0] / r[1] for r in runs2])
    rows.append(
        Row(
            "e2e bash-API jobs, flow run --workers 2",
            n,
            rate,
            "jobs/s",
            baseline=median([r[1] for r in runs2]),
            baseline_name="seq N | xargs -P2 -n1 bash -c true",
            target=">= 0.5 x xargs bash",
            ok=ratio2 >= 0.5,
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


@benchmark("claim")
def bench_claim(b: Bench) -> list[Row]:
    """Cold `flow serve` start to its first claim with N ready jobs, beside the bare import."""
    imp_argv = [b.python, "-c", "import httk_flow.cli.main"]
    rows = []
    for n in b.profile.backlogs:
        ws = b.ready_workspace(n, runners(b)["flow_hold"])
        argv = [b.flow, "-w", ws, "serve", "--workers", "1", "--log-format", "json"]

        def once(argv: list[str] = argv, ws: str = ws) -> tuple[float, float, float]:
            imp = b.timed(imp_argv)  # paired: the same moment's interpreter start-up
            # the jobs hold their worker, so repetitions do not run the backlog down
            total, tick = first_claim(b, argv, stop_timeout=5, linger=0.3)
            stray_kill(ws)
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
