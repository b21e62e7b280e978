#!/usr/bin/env python3
"""Benchmarks of httk_flow, each figure beside a baseline measured in the same run.

    python benchmarks/run.py --profile quick|full [--json OUT.json] [--only NAME]...
    python benchmarks/run.py --profile quick --with-reference [--reference-python PATH]
    python benchmarks/run.py --profile quick --only e2e --only bash_api --profile-to DIR

Benchmarks are functions registered by name (harness.BENCHMARKS); each returns rows
{name, n, value, unit, baseline?, ratio?, ...}. Every workspace is built under one
temporary directory, removed afterwards. The machine is assumed shared and noisy: each
measurement runs up to three times (median reported) and is quoted as a ratio to a
baseline taken in the same repetition, not as an absolute to compare across machines.

With --with-reference the runner installs the reference engine (httk-workflow 2.1.1) and
HyperQueue into a virtual environment under the temporary directory and runs the
comparisons (versus.py, vs_backlog.py) instead: each row puts httk_flow beside the
reference (or a floor, or HyperQueue) on the same work, with the ratio and a growth check
(cost at 10x N over cost at N). See docs/benchmarks.md.

With --profile-to DIR the runner then profiles httk_flow's side of the selected benchmarks'
e2e workloads (profiling.py): py-spy of the manager, strace -c of the manager alone and
strace -f -c of everything, the manager's and the jobs' CPU from getrusage and wait4, and
DIR/summary.md with the per-job figures. It does not need --with-reference.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import compare
import dependencies  # noqa: F401
import packing  # noqa: F401
import profiling
import reference
import solo  # noqa: F401  (registers the benchmarks)
import versus  # noqa: F401
import vs_backlog  # noqa: F401
from harness import BENCHMARKS, PROFILES, REPO, Bench, BenchError, Row, find_flow, machine, table

# -- main -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    ap.add_argument("--json", metavar="OUT", help="also write the rows as JSON here")
    ap.add_argument(
        "--only",
        action="append",
        choices=[*BENCHMARKS, *compare.VERSUS],
        help="run only these (repeatable); vs_* need --with-reference",
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
    ap.add_argument(
        "--profile-to",
        metavar="DIR",
        help="after the benchmarks, profile httk_flow's side of their e2e workloads into DIR:\n"
        "py-spy of the manager (DIR/<workload>.pyspy.txt: top functions), strace -c of the\n"
        "manager alone and strace -f -c of everything (.strace-manager.txt, .strace-all.txt),\n"
        "and DIR/summary.md (manager and job-side CPU ms/job, syscalls/job, inodes/job).\n"
        "Needs strace; py-spy from PATH, else installed from PyPI into a temporary venv.\n"
        "Workloads: e2e-bash-api (bash_api, vs_e2e, vs_meta), e2e-true (e2e, vs_e2e),\n"
        "e2e-two-step (vs_two_step), e2e-fanout (vs_fanout); those two single-step ones if\n"
        "no selected benchmark has one",
    )
    ap.add_argument(
        "--profile-jobs",
        type=int,
        metavar="N",
        help="jobs per profiled workload (default: the profile's e2e size)",
    )
    ref = ap.add_argument_group("reference engine (httk-workflow 2.1.1) and HyperQueue")
    ref.add_argument(
        "--with-reference",
        action="store_true",
        help="install the reference and HyperQueue into a venv under the temporary directory\n"
        "and run the vs_* benchmarks: httk_flow beside them on the same work",
    )
    ref.add_argument(
        "--reference-python",
        metavar="PATH",
        help="Python >= 3.12 for the reference (default: python3.12 or python3.13 on PATH,\n"
        "else pyenv's versions/ (3.12 first, then newer))",
    )
    ref.add_argument(
        "--reference-venv",
        metavar="DIR",
        help="make (or reuse, if it already holds the reference) the venv here instead",
    )
    ref.add_argument(
        "--reference-poll",
        type=float,
        default=0.01,
        metavar="SECONDS",
        help="the reference manager's --poll-interval (its default is 1; default here 0.01)",
    )
    ref.add_argument(
        "--no-hyperqueue", action="store_true", help="do not install or run HyperQueue"
    )
    args = ap.parse_args(argv)
    names = args.only or (compare.ordered() if args.with_reference else list(BENCHMARKS))
    if not args.with_reference and any(n in compare.VERSUS for n in names):
        ap.error("the vs_* benchmarks need --with-reference")

    profile = PROFILES[args.profile]
    # a SIGTERM ends the run through the finally below, which removes the temporary directory
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
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
    vs_rows: list[Row] = []
    errors: dict[str, str] = {}
    profiled = ""
    t0 = time.monotonic()
    try:
        bench.warm_up()
        if args.with_reference:
            try:
                bench.reference = reference.setup_reference(
                    bench,
                    python=args.reference_python,
                    venv=args.reference_venv and os.path.abspath(args.reference_venv),
                    poll=args.reference_poll,
                    hyperqueue=not args.no_hyperqueue,
                )
                info.update(bench.reference.describe())
                info["strace"] = _strace_version()
                bench.reference.warm_up()
            except BenchError as e:
                errors["reference"] = str(e)
                bench.say(f"reference FAILED: {e}")
                names = [n for n in names if n not in compare.VERSUS]
        for name in names:
            try:
                if name in compare.VERSUS:
                    vs_rows += compare.VERSUS[name](bench)
                else:
                    rows += BENCHMARKS[name](bench)
            except BenchError as e:
                errors[name] = str(e)
                bench.say(f"{name} FAILED: {e}")
        if args.profile_to:
            try:
                profiled = profiling.profile(
                    bench, names, os.path.abspath(args.profile_to), args.profile_jobs
                )
            except BenchError as e:
                errors["profile-to"] = str(e)
                bench.say(f"--profile-to FAILED: {e}")
    finally:
        if args.keep:
            bench.say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    info["loadavg_end"] = os.getloadavg()[0]
    info["seconds"] = round(time.monotonic() - t0, 1)
    if rows:
        print(table(rows))
    if vs_rows:
        print(("\n" if rows else "") + compare.table(vs_rows))
    print(
        f"\n{info['nproc']} CPUs, {info['memory_gb']} GB, Python {info['python']}, "
        f"{info['filesystem']}, package {info['package']}, load {info['loadavg']:.2f} -> "
        f"{info['loadavg_end']:.2f}, {info['seconds']}s"
    )
    if bench.reference is not None:
        d = bench.reference.describe()
        print(
            f"reference {d['reference']} on Python {d['reference_python']}, "
            f"--poll-interval {d['reference_poll_interval']:g}; HyperQueue {d['hyperqueue']}"
        )
    if profiled:
        print(f"\nprofiles in {os.path.abspath(args.profile_to)}:\n\n{profiled}")
    for name, err in errors.items():
        print(f"FAILED {name}: {err}")
    if args.json:
        doc = {
            "profile": profile.name,
            "machine": info,
            "rows": [r.to_json() for r in rows + vs_rows],
            "errors": errors,
        }
        with open(args.json, "wb") as fh:
            fh.write(json.dumps(doc, indent=2).encode() + b"\n")
    return 1 if errors else 0


def _strace_version() -> str:
    try:
        p = subprocess.run(["strace", "-V"], capture_output=True, text=True, check=False)
    except OSError:
        return "not installed"
    return (p.stdout.splitlines() or ["?"])[0]


if __name__ == "__main__":
    sys.exit(main())
