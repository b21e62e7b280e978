"""httk_flow beside its reference engine (httk-workflow 2.1.1) and HyperQueue, same work.

Run by `run.py --with-reference` (see reference.py for how the reference is found and
installed). This module holds submission, the end-to-end workloads and the metadata
count; vs_backlog.py the comparisons on ready backlogs.

The reference's bash SDK starts a Python interpreter per SDK call; a second reference
runner publishes the same outcomes by hand through its documented rename protocol
(outcome.tmp.<x>/outcome.json renamed to outcome.ready), so that the SDK's interpreter
starts are separated from its manager's own cost.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from typing import Any

from compare import (
    SIZES,
    Point,
    Target,
    _flow_points,
    _measure,
    at_least,
    group_syscalls,
    pair_rows,
    strace_counts,
    versus,
)
from harness import Bench, BenchError, Row
from programs import runners
from workloads import (
    _hq_ok,
    _need_reference,
    floor_submit,
    flow_submit,
    flow_workload,
    hq_run,
    ref_submit,
    ref_workload,
    xargs_argv,
    xargs_script_argv,
)

# -- 1. bulk submission --------------------------------------------------------------------


@versus("vs_submit")
def vs_submit(b: Bench) -> list[Row]:
    """jobs/s of one bulk submission of N bash-API no-op jobs, each engine's bulk path."""
    _need_reference(b)
    sz = SIZES[b.profile.name]
    rows = []
    for durable in (False, True):
        mode = "durable" if durable else "non-durable"
        sides = {"flow": sz.submit, "ref": sz.ref_submit, "floor": sz.submit}

        def once(i: int, durable: bool = durable) -> dict[str, tuple[float, str, dict]]:
            out: dict[str, tuple[float, str, dict]] = {}
            n = sz.submit[i]
            out["flow"] = (n / flow_submit(b, n, durable=durable), "", {})
            out["floor"] = (n / floor_submit(b, n, durable=durable), "", {})
            if i < len(sz.ref_submit):
                m = sz.ref_submit[i]
                out["ref"] = (m / ref_submit(b, m, durable=durable), "", {})
            return out

        pts = _measure(b, f"vs submit {mode}", sides, once)
        rows += pair_rows(
            f"submit {mode}",
            "jobs/s",
            _flow_points(pts),
            {"reference": pts["ref"], "filesystem floor": pts["floor"]},
            targets={"reference": at_least(30, "reference")},
            commands={
                "reference": f"flow submit --array 1-N api1.sh  |  python: httk.workflow."
                f"scaffold.new_jobs(Workspace(WS, durable={durable}), sdk1.sh, N items)",
                "filesystem floor": "flow submit --array 1-N api1.sh  |  the same files "
                "made by a bare Python script (no engine)",
            },
        )
    return rows


# -- 3. end to end: single-step, two-step, fan-out ------------------------------------------


def _e2e_rows(
    b: Bench,
    title: str,
    flow_prog: str,
    flow_sizes: Sequence[int],
    hand_sizes: Sequence[int],
    sdk_sizes: Sequence[int],
    *,
    sdk_prog: str,
    params: Callable[[int], dict[str, Any]] | None = None,
    fanout: bool = False,
    floors: bool = False,
    durable: bool = False,
) -> list[Row]:
    """Rates of one workload: flow, the reference by hand and by SDK (+ HQ and floors)."""
    r = runners(b)
    sides: dict[str, Sequence[int]] = {"flow": flow_sizes, "hand": hand_sizes}
    if sdk_sizes:
        sides["sdk"] = sdk_sizes
    if floors:
        # the floors, /bin/true jobs through httk_flow, and HyperQueue on both kinds of work
        for side in ("xargs_bash", "xargs_sh", "xargs_script", "flow_true"):
            sides[side] = flow_sizes
        if _hq_ok(b):
            sides["hq"] = flow_sizes
            sides["hq_script"] = flow_sizes

    def jobs_of(n: int) -> int:
        return n + 1 if fanout else n

    def ref_side(runner: str, n: int) -> tuple[float, str, dict]:
        if fanout:
            secs, done, note, detail = ref_workload(
                b, runner, 1, durable=durable, params={"children": n}, expected=n + 1
            )
        else:
            secs, done, note, detail = ref_workload(
                b, runner, n, durable=durable, params=params(n) if params else None
            )
        return done / secs, note, detail

    def once(i: int) -> dict[str, tuple[float, str, dict]]:
        out: dict[str, tuple[float, str, dict]] = {}
        n = flow_sizes[i]
        if floors:
            out["xargs_bash"] = (n / b.timed(xargs_argv(n, "bash")), "", {})
            out["xargs_sh"] = (n / b.timed(xargs_argv(n, "sh")), "", {})
            out["xargs_script"] = (n / b.timed(xargs_script_argv(n, r["noop"])), "", {})
            if "hq" in sides:
                secs, detail = hq_run(b, n)
                out["hq"] = (n / secs, "", detail)
                secs, detail = hq_run(b, n, r["hq_api1"])
                out["hq_script"] = (n / secs, "", detail)
            secs, detail = flow_workload(b, "true", n, durable=durable)
            out["flow_true"] = (n / secs, "", detail)
        secs, detail = flow_workload(
            b, flow_prog, n, durable=durable, children=n if fanout else None
        )
        out["flow"] = (jobs_of(n) / secs, "", detail)
        if i < len(hand_sizes):
            out["hand"] = ref_side(r["ref_hand"], hand_sizes[i])
        if "sdk" in sides and i < len(sdk_sizes):
            out["sdk"] = ref_side(sdk_prog, sdk_sizes[i])
        return out

    pts = _measure(b, title, sides, once)
    peers: dict[str, Sequence[Point | None]] = {}
    targets: dict[str, Target] = {}
    if "sdk" in pts:
        peers["reference (bash SDK)"] = pts["sdk"]
        targets["reference (bash SDK)"] = at_least(100, "reference")
    peers["reference (hand-published outcome)"] = pts["hand"]
    if floors:
        peers["xargs -P2 bash -c true"] = pts["xargs_bash"]
        targets["xargs -P2 bash -c true"] = at_least(0.5, "xargs bash")
        peers["xargs -P2 -n1 ./noop.sh"] = pts["xargs_script"]
        peers["xargs -P2 sh -c true"] = pts["xargs_sh"]
        if "hq" in pts:
            peers["HyperQueue (./hq_api1.sh, same bash work)"] = pts["hq_script"]
            targets["HyperQueue (./hq_api1.sh, same bash work)"] = at_least(1.0, "HyperQueue")
            peers["HyperQueue (bash -c true)"] = pts["hq"]
    unit = "jobs/s"
    rows = pair_rows(
        title,
        unit,
        _flow_points(pts),
        peers,
        targets=targets,
        commands={
            "reference (bash SDK)": f"flow run --workers 2 on {os.path.basename(flow_prog)}  "
            f"|  httk workflow run --inline --workers 2 --poll-interval "
            f"{b.reference.poll:g} on {os.path.basename(sdk_prog)}",
            "reference (hand-published outcome)": "the same manager on ref_hand.sh (outcome "
            "published by mkdir + printf + mv, no interpreter)",
            "xargs -P2 bash -c true": "seq N | xargs -P2 -n1 bash -c true",
            "xargs -P2 sh -c true": "seq N | xargs -P2 -n1 sh -c true",
            "xargs -P2 -n1 ./noop.sh": "cd DIR && seq N | xargs -P2 -n1 ./noop.sh  (a "
            "#!/usr/bin/env bash script file holding `:`: a bare `bash script.sh`)",
            "HyperQueue (./hq_api1.sh, same bash work)": "hyperqueue LocalCluster, one worker "
            "with 2 cores, N tasks `./hq_api1.sh` with task_dir=True (a #!/usr/bin/env bash "
            "script whose step function printf's an outcome JSON into $HQ_TASK_DIR); whole "
            "script wall time",
            "HyperQueue (bash -c true)": "hyperqueue LocalCluster, one worker with 2 cores, "
            "N tasks `bash -c true`; whole script wall time",
        },
    )
    if floors:
        # the same repetitions' /bin/true jobs through httk_flow, beside the sh floor
        rows += pair_rows(
            title + ", /bin/true jobs",
            unit,
            [p for p in pts["flow_true"] if p is not None],
            {"xargs -P2 sh -c true": pts["xargs_sh"]},
            targets={"xargs -P2 sh -c true": at_least(0.5, "xargs sh")},
            commands={
                "xargs -P2 sh -c true": "flow submit --array 1-N true; flow run --workers 2  "
                "|  seq N | xargs -P2 -n1 sh -c true"
            },
        )
    return rows


@versus("vs_e2e")
def vs_e2e(b: Bench) -> list[Row]:
    """N single-step no-op jobs reporting success through each engine's bash API, 2 workers."""
    _need_reference(b)
    sz = SIZES[b.profile.name]
    r = runners(b)
    rows = _e2e_rows(
        b,
        "e2e single-step",
        r["flow_api1"],
        sz.e2e,
        sz.e2e_hand,
        sz.e2e_sdk,
        sdk_prog=r["ref_sdk1"],
        floors=True,
    )
    rows += _e2e_rows(
        b,
        "e2e single-step, durable",
        r["flow_api1"],
        sz.e2e,
        sz.e2e_hand,
        (),
        sdk_prog=r["ref_sdk1"],
        durable=True,
    )
    return rows


@versus("vs_two_step")
def vs_two_step(b: Bench) -> list[Row]:
    """N two-step no-op jobs (advance, then succeed), 2 workers."""
    _need_reference(b)
    sz = SIZES[b.profile.name]
    r = runners(b)
    return _e2e_rows(
        b,
        "e2e two-step",
        r["flow_api2"],
        sz.two_step,
        sz.two_step_hand,
        sz.two_step_sdk,
        sdk_prog=r["ref_sdk2"],
        params=lambda n: {"two_step": True},
    )


@versus("vs_fanout")
def vs_fanout(b: Bench) -> list[Row]:
    """One parent spawning N no-op children and joining them (N+1 jobs/s), 2 workers."""
    _need_reference(b)
    sz = SIZES[b.profile.name]
    r = runners(b)
    return _e2e_rows(
        b,
        "e2e fan-out + join",
        r["flow_fanout"],
        sz.fanout,
        sz.fanout_hand,
        sz.fanout_sdk,
        sdk_prog=r["ref_sdk_fanout"],
        fanout=True,
    )


# -- 4. metadata per job ----------------------------------------------------------------------


@versus("vs_meta")
def vs_meta(b: Bench) -> list[Row]:
    """Metadata syscalls per job (strace -f -c over submission and run) and inodes left.

    Each side runs at two sizes; a per-job figure is (total at the larger - total at the
    smaller) / (difference in jobs), the marginal cost of one more job, so that interpreter
    starts and workspace set-up, paid once per command, are not spread over the jobs.
    """
    _need_reference(b)
    if not shutil.which("strace"):
        raise BenchError("strace is not installed")
    sz = SIZES[b.profile.name]
    r = runners(b)

    def totals(prefix: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for part in (".submit", ".run"):
            if os.path.exists(prefix + part):
                for k, v in strace_counts(prefix + part).items():
                    counts[k] = counts.get(k, 0) + v
        return counts

    def marginal(
        small: tuple[dict[str, int], int, float], large: tuple[dict[str, int], int, float]
    ) -> tuple[dict[str, float], float]:
        (c1, n1, i1), (c2, n2, i2) = small, large
        diff = {k: c2.get(k, 0) - c1.get(k, 0) for k in set(c1) | set(c2)}
        split = {k: round(v, 2) for k, v in group_syscalls(diff, n2 - n1).items()}
        split["all-in at the larger n"] = round(group_syscalls(c2, n2)["metadata"], 1)
        return split, (i2 - i1) / (n2 - n1)

    def flow_side(n: int) -> tuple[dict[str, int], int, float]:
        trace = b.path("strace-flow")
        _, detail = flow_workload(b, r["flow_api1"], n, strace=trace)
        return totals(trace), n, detail["inodes_per_job"] * n

    def ref_side(runner: str, n: int) -> tuple[dict[str, int], int, float, str]:
        trace = b.path("strace-ref")
        _, done, note, detail = ref_workload(b, runner, n, strace=trace)
        if done != n:
            raise BenchError(f"the reference finished {done} of {n} jobs under strace: {note}")
        return totals(trace), n, detail["inodes_per_job"] * n, note

    def floor_side(n: int) -> tuple[dict[str, int], int, float]:
        trace = b.path("strace-floor")
        b.sh(["strace", "-f", "-c", "-o", trace + ".run", "--", *xargs_argv(n, "bash")])
        return totals(trace), n, 0.0

    def once(i: int) -> dict[str, tuple[float, str, dict]]:
        out: dict[str, tuple[float, str, dict]] = {}
        split, inodes = marginal(*(flow_side(n) for n in sz.meta))
        out["flow"] = (split["metadata"], "", split)
        out["flow_inodes"] = (inodes, "", {})
        for side, runner, sizes in (
            ("hand", r["ref_hand"], sz.meta_hand),
            ("sdk", r["ref_sdk1"], sz.meta_sdk),
        ):
            got = [ref_side(runner, n) for n in sizes]
            split, inodes = marginal(got[0][:3], got[1][:3])
            out[side] = (split["metadata"], "", split)
            out[side + "_inodes"] = (inodes, "", {})
        split, _ = marginal(*(floor_side(n) for n in sz.meta))
        out["floor"] = (split["metadata"], "", split)
        return out

    big = {
        k: (v[1],) for k, v in {"flow": sz.meta, "hand": sz.meta_hand, "sdk": sz.meta_sdk}.items()
    }
    sides = {
        "flow": big["flow"],
        "flow_inodes": big["flow"],
        "hand": big["hand"],
        "hand_inodes": big["hand"],
        "sdk": big["sdk"],
        "sdk_inodes": big["sdk"],
        "floor": big["flow"],
    }
    pts = _measure(b, "vs metadata syscalls", sides, once)
    ns = f"{sz.meta[0]}->{sz.meta[1]} | {sz.meta_hand[0]}->{sz.meta_hand[1]} (hand), "
    ns += f"{sz.meta_sdk[0]}->{sz.meta_sdk[1]} (SDK) jobs"
    rows = pair_rows(
        "metadata syscalls per job",
        "calls/job",
        [p for p in pts["flow"] if p is not None],
        {
            "reference (bash SDK)": pts["sdk"],
            "reference (hand-published outcome)": pts["hand"],
            "xargs -P2 bash -c true": pts["floor"],
        },
        better="lower",
        targets={
            "reference (bash SDK)": at_least(100, "fewer than the reference"),
            "reference (hand-published outcome)": at_least(100, "fewer than the reference"),
        },
        commands={
            "reference (bash SDK)": "strace -f -c over `flow submit` + `flow run` | over the "
            "reference's new_jobs script + `httk workflow run`; rename + open/create + stat "
            f"family + fsync + mkdir + unlink; marginal per job between {ns}",
        },
    )
    rows += pair_rows(
        "inodes left per finished job",
        "inodes/job",
        [p for p in pts["flow_inodes"] if p is not None],
        {
            "reference (bash SDK)": pts["sdk_inodes"],
            "reference (hand-published outcome)": pts["hand_inodes"],
        },
        better="lower",
        commands={
            "reference (bash SDK)": "entries under the workspace after the run; marginal per "
            f"finished job between {ns}"
        },
    )
    return rows
