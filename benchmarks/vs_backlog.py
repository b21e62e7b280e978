"""Comparisons on ready backlogs: first claim, manager peak RSS, status."""

from __future__ import annotations

import time

from compare import (
    FLAT_CLAIM,
    FLAT_RSS,
    SIZES,
    _flow_points,
    _measure,
    at_least,
    pair_rows,
    versus,
)
from harness import Bench, Row, first_claim, stray_kill
from programs import runners
from reference import _name
from workloads import (
    _flow_claim,
    _is_ref_claim,
    _is_ref_serving,
    _need_reference,
    _peak_rss,
)


@versus("vs_claim")
def vs_claim(b: Bench) -> list[Row]:
    """Cold manager start to its first claim with N ready jobs."""
    ref = _need_reference(b)
    sz = SIZES[b.profile.name]
    prog = runners(b)["flow_hold"]

    def once(i: int) -> dict[str, tuple[float, str, dict]]:
        n = sz.backlogs[i]
        ws = b.ready_workspace(n, prog)
        argv = [b.flow, "-w", ws, "serve", "--workers", "1", "--log-format", "json"]
        # linger: httk_flow does not stop an attempt it launches after a SIGTERM that came
        # between the claim and the launch (it would wait for the held program)
        total, tick = first_claim(b, argv, stop_timeout=5, linger=0.3)
        stray_kill(ws)
        out = {"flow": (total, "", {"first_tick_s": round(tick, 4)})}
        if i < len(sz.ref_backlogs):
            rws = ref.ready_workspace(sz.ref_backlogs[i])
            rargv = [
                *ref.manager_argv(rws, workers=1),
                "--json-logs",
                "--log-level",
                "info",
            ]
            rtotal, rtick = first_claim(
                b,
                rargv,
                env=ref.env,
                serving=_is_ref_serving,
                claimed=_is_ref_claim,
                stop_timeout=5,
            )
            stray_kill(rws)
            out["ref"] = (rtotal, "", {"after_manager_started_s": round(rtick, 4)})
        return out

    # fixtures first, so that their build time is not inside a repetition
    for n in sz.backlogs:
        b.ready_workspace(n, prog)
    for n in sz.ref_backlogs:
        ref.ready_workspace(n)
    pts = _measure(b, "vs first claim", {"flow": sz.backlogs, "ref": sz.ref_backlogs}, once)
    return pair_rows(
        "cold start to first claim",
        "s",
        _flow_points(pts),
        {"reference": pts["ref"]},
        better="lower",
        targets={"reference": at_least(30, "reference")},
        flat=FLAT_CLAIM,
        commands={
            "reference": "flow serve --workers 1 --log-format json  |  httk workflow run "
            "--inline --workers 1 --json-logs: spawn -> first claimed transition on stderr"
        },
    )


@versus("vs_rss")
def vs_rss(b: Bench) -> list[Row]:
    """Peak RSS (VmHWM) of a manager (2 workers, N ready jobs) a few seconds past its 1st claim."""
    ref = _need_reference(b)
    sz = SIZES[b.profile.name]
    prog = runners(b)["flow_hold"]
    secs = b.profile.serve_seconds

    def once(i: int) -> dict[str, tuple[float, str, dict]]:
        ws = b.ready_workspace(sz.backlogs[i], prog)
        argv = [b.flow, "-w", ws, "serve", "--workers", "2", "--log-format", "json"]
        mb, claim = _peak_rss(b, argv, b.env, secs, _flow_claim)
        stray_kill(ws)
        out = {"flow": (mb, "", {"first_claim_s": round(claim, 3)})}
        if i < len(sz.ref_backlogs):
            rws = ref.ready_workspace(sz.ref_backlogs[i])
            rargv = [*ref.manager_argv(rws), "--json-logs", "--log-level", "info"]
            mb, claim = _peak_rss(b, rargv, ref.env, secs, _is_ref_claim)
            stray_kill(rws)
            out["ref"] = (mb, "", {"first_claim_s": round(claim, 3)})
        return out

    for n in sz.backlogs:
        b.ready_workspace(n, prog)
    for n in sz.ref_backlogs:
        ref.ready_workspace(n)
    pts = _measure(b, "vs manager RSS", {"flow": sz.backlogs, "ref": sz.ref_backlogs}, once)

    def ten_times(r: Row, last: bool) -> tuple[str, bool | None] | None:
        if r.n < 100_000:
            return None
        adv = r.advantage
        return ">= 10x smaller", None if adv is None else adv >= 10

    return pair_rows(
        "manager peak RSS",
        "MB",
        _flow_points(pts),
        {"reference": pts["ref"]},
        better="lower",
        targets={"reference": ten_times},
        flat=FLAT_RSS,
        commands={
            "reference": "flow serve --workers 2  |  httk workflow run --inline --workers 2; "
            f"VmHWM {secs:g}s after the first claim"
        },
    )


@versus("vs_status")
def vs_status(b: Bench) -> list[Row]:
    """`flow status` against `httk workspace status` on the ready backlogs."""
    ref = _need_reference(b)
    sz = SIZES[b.profile.name]
    prog = runners(b)["flow_hold"]

    def once(i: int) -> dict[str, tuple[float, str, dict]]:
        ws = b.ready_workspace(sz.backlogs[i], prog)
        out = {"flow": (b.timed([b.flow, "-w", ws, "status"]), "", {})}
        if i < len(sz.ref_backlogs):
            rws = ref.ready_workspace(sz.ref_backlogs[i])
            t0 = time.perf_counter()
            ref.sh([ref.httk, "workspace", "status", _name(rws)])
            out["ref"] = (time.perf_counter() - t0, "", {})
        return out

    pts = _measure(b, "vs status", {"flow": sz.backlogs, "ref": sz.ref_backlogs}, once)
    return pair_rows(
        "status",
        "s",
        _flow_points(pts),
        {"reference": pts["ref"]},
        better="lower",
        commands={"reference": "flow -w WS status  |  httk workspace status WS"},
    )
