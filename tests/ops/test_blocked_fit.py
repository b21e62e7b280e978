"""Nothing waits silently: ready work no live manager can fit is blocked in `flow status`
with its numbers, and `flow wait` says why nothing moves (real processes throughout)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import orjson
import pytest
from helpers import wait_for
from manager.support import Managers, flow, log_of, submit, write_script

from httk_flow.manager.config import ALLOCATION_END_ENV
from httk_flow.ops.fit import QueueTimes, TimeRequests, allocation_walltime, steady
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace


def serve_in_allocation(managers: Managers, root: str, ends_in: float) -> None:
    """A manager whose allocation ends in `ends_in` s, drains 1m before, up to 1m early."""
    env = {ALLOCATION_END_ENV: str(time.time() + ends_in)}
    args = ("--drain-before", "1m", "--signal-margin", "1m")
    p = managers.start(root, *args, command="serve", env=env)
    wait_for(lambda: '"alive": true' in flow("-w", root, "managers", "--json").stdout, 20)
    assert p.poll() is None, log_of(p)


def test_status_blocks_work_no_live_manager_can_fit_with_the_reason_and_numbers(
    root: str, scripts: Path, managers: Managers
) -> None:
    program = write_script(scripts, "ok.sh", "exit 0\n")
    submit(root, program, count=2, time=3600.0)
    submit(root, program, time=1.0)
    serve_in_allocation(managers, root, 300.0)  # 3 minutes of usable time
    wait_for(
        lambda: (
            orjson.loads(flow("-w", root, "status", "--json").stdout)["counts"]["succeeded"] == 1
        ),
        20,
    )
    text = flow("-w", root, "status").stdout
    [line] = [x for x in text.splitlines() if x.startswith("blocked:")]
    assert re.fullmatch(
        r"blocked: 2 jobs: needs 1h; the longest remaining manager time is (?:2m\d\ds|3m); "
        r"submit allocations of at least 1h3m",
        line,
    ), text
    doc = orjson.loads(flow("-w", root, "status", "--json").stdout)
    [entry] = doc["blocked"]
    assert entry["count"] == 2
    assert steady(entry["reason"]) == steady(line.removeprefix("blocked: 2 jobs: "))
    assert entry["needs"] == 3600.0
    assert 150 < entry["longest_remaining"] <= 180
    assert entry["walltime"] == allocation_walltime(3600.0, 120.0) == 3780.0
    assert entry["estimated"] is False


def test_status_says_nothing_blocks_work_a_live_manager_can_fit(
    root: str, scripts: Path, managers: Managers
) -> None:
    program = write_script(scripts, "hold.sh", "sleep 30\n")
    submit(root, program, count=3, time=60.0)  # two run, one waits for a free worker
    serve_in_allocation(managers, root, 600.0)
    wait_for(
        lambda: orjson.loads(flow("-w", root, "status", "--json").stdout)["counts"]["running"] == 2,
        20,
    )
    assert orjson.loads(flow("-w", root, "status", "--json").stdout)["blocked"] == []


def test_flow_wait_says_once_why_nothing_moves_also_off_a_terminal(
    root: str, scripts: Path, managers: Managers
) -> None:
    program = write_script(scripts, "ok.sh", "exit 0\n")
    submit(root, program, time=3600.0)
    [paused] = submit(root, program)
    assert managers.run(root, "--pool", "nowhere") == 0  # registers both, serves neither
    r = flow("-w", root, "pause", paused)
    assert r.returncode == 0, r.stderr
    serve_in_allocation(managers, root, 300.0)
    t0 = time.monotonic()
    r = flow("-w", root, "wait", "--timeout", "9")
    assert r.returncode == 3, r.stderr
    assert time.monotonic() - t0 < 20
    assert r.stdout == "0/2 done: 0 succeeded, 0 failed, 0 cancelled (timed out)\n"
    lines = r.stderr.splitlines()
    # said once, though the remaining time changes at every look
    assert len(lines) == 2, r.stderr
    assert re.fullmatch(
        r"flow wait: nothing moves: blocked: 1 job: needs 1h; the longest remaining manager "
        r"time is (?:2m\d\ds|3m); submit allocations of at least 1h3m",
        lines[0],
    ), r.stderr
    assert lines[1] == "flow wait: nothing moves: 1 paused job; `flow resume` continues it"


def test_flow_wait_with_a_short_timeout_still_says_why(root: str, scripts: Path) -> None:
    submit(root, write_script(scripts, "ok.sh", "exit 0\n"))
    r = flow("-w", root, "wait", "--timeout", "0.5")
    assert r.returncode == 3
    assert r.stderr == (
        "flow wait: nothing moves: blocked: 1 job: no live manager to register "
        "submissions; start one with `flow serve` or `flow run`\n"
    )


def test_flow_wait_says_nothing_while_work_moves(
    root: str, scripts: Path, managers: Managers
) -> None:
    [jid] = submit(root, write_script(scripts, "slow.sh", "sleep 4\n"), time=10.0)
    managers.start(root, command="serve")
    r = flow("-w", root, "wait", jid, "--timeout", "30")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""


def test_a_look_reads_a_bounded_sample_and_learns_the_rest_over_looks(
    root: str, scripts: Path
) -> None:
    program = write_script(scripts, "ok.sh", "exit 0\n")
    submit(root, program, count=30, time=60.0)
    submit(root, program, count=10, time=600.0)
    ws = Workspace.open(root)
    try:
        from httk_flow.protocol.discovery import walk_all

        req = TimeRequests(ws, per_class=8, total=8)
        looks = []
        for _ in range(8):
            look = req.look()
            for h in walk_all(ws, State.SUBMITTED):
                look.see(h)
            [q] = look.finish().values()
            looks.append(q)
            assert q.n == 40
        first, last = looks[0], looks[-1]
        assert first.sampled == 8 and not first.exact  # 8 job.json read, 32 estimated
        # an estimate from 8 of 40: a sample may hold none of the ten long ones (about 1 in
        # 13), so the estimate is bounded, not nonzero
        assert 0 <= first.count(lambda t: t == 600.0) <= 40
        assert first.count(lambda t: t in (60.0, 600.0)) == 40
        assert last.exact  # 8 more each look, every one kept: all 40 known
        assert last.count(lambda t: t == 600.0) == 10
        assert len(req.known) == 40
    finally:
        ws.close()


def test_queue_times_estimate_from_what_was_read() -> None:
    from collections import Counter

    q = QueueTimes(100, Counter({60.0: 5, None: 5}))
    assert q.count(lambda t: t == 60.0) == 50
    assert q.count(lambda t: t is None) == 50
    assert QueueTimes(3, Counter({60.0: 3})).count(lambda t: t == 60.0) == 3
    assert steady("needs 1h; the longest remaining manager time is 2m5s; x") == steady(
        "needs 1h; the longest remaining manager time is 1m59s; x"
    )


def test_the_time_fit_walks_a_bounded_share_of_a_large_ready_queue(
    root: str, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ready jobs counted by name, then handles built for at most WALK_PER_SAMPLE times the
    sample: the blocked count is estimated for every counted job, not those walked."""
    from httk_flow.ops import fit, status
    from httk_flow.protocol.discovery import walk_all
    from httk_flow.protocol.jobs import register
    from httk_flow.protocol.leases import ManagerInfo, write_heartbeat

    submit(root, write_script(scripts, "ok.sh", "exit 0\n"), count=40, time=3600.0)
    ws = Workspace.open(root)
    try:
        for h in list(walk_all(ws, State.SUBMITTED)):
            register(ws, h, actor="test")
        now = time.time()
        # a manager on another host, heard from just now, with 5 minutes left
        info = ManagerInfo("mfar", "node-far", 4242, now, ends_at=now + 300, lease=600.0, seq=1)
        write_heartbeat(ws, info)
        seen = []
        real_see = fit.Look.see
        monkeypatch.setattr(fit.Look, "see", lambda look, h: (seen.append(h), real_see(look, h)))
        report = status.workspace_status(ws, times=TimeRequests(ws, per_class=2, total=2))
    finally:
        ws.close()
    assert len(seen) == status.WALK_PER_SAMPLE * 2 < 40
    [(reason, n)] = report.blocked
    assert n == report.stuck_ready == 40
    assert reason.startswith("needs 1h;") and reason.endswith("(estimated from 2 of 40 jobs read)")
