"""Time against a real Slurm: a manager in an allocation claims only work that ends before
the drain Slurm will actually send (the end less `--drain` less Slurm's early-signal
margin), work that fits no allocation is blocked with its numbers and not paid for, and
`flow scale --max-time` asks for an allocation long enough. Every batch job a test
submits is cancelled after it; each test stays under about three minutes."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from helpers import wait_for
from manager.support import all_jobs, dump, flow, job, submit, write_script

from httk_flow.protocol.states import State

from .support import Cluster

pytestmark = pytest.mark.slurm

#: an honest job: it declares 60 s and needs 50
HONEST = """
touch "$FLOW_WORKDIR/started"
sleep 50
"""


def status(root: str) -> dict[str, object]:
    return dict(orjson.loads(flow("-w", root, "status", "--json").stdout))


def managers_json(root: str) -> list[dict[str, object]]:
    return list(orjson.loads(flow("-w", root, "managers", "--json").stdout)["managers"])


def scale_until(
    root: str, args: list[str], done: Callable[[], bool], timeout: float
) -> list[dict[str, object]]:
    """`flow scale --once --json ARGS` every 2 s until `done()`; every pass's report."""
    reports = []
    deadline = time.monotonic() + timeout
    while True:
        p = flow("scale", "-w", root, "--backend", "slurm", "--once", "--json", *args)
        assert p.returncode == 0, p.stderr
        reports.append(dict(orjson.loads(p.stdout)))
        if done():
            return reports
        assert time.monotonic() < deadline, (reports[-3:], dump(root))
        time.sleep(2)


def test_an_honest_job_is_not_claimed_where_the_drain_would_cut_it_and_runs_once(
    root: str, scripts: Path, cluster: Cluster
) -> None:
    """The reported case, made short: a 2m allocation that drains 30 s before its end
    (and Slurm may signal a minute earlier) leaves 30 s; a job of 60 s waits for one that
    fits, which `flow scale --max-time` submits, and runs there once, never drained."""
    [jid] = submit(root, write_script(scripts, "honest.sh", HONEST), time=60.0)
    p = flow("sbatch", "-w", root, "--time", "2m", "--drain", "30s")
    assert p.returncode == 0, p.stderr
    assert p.stderr == (
        "flow: warning: --time 2m leaves only 30s for work: managers claim only jobs that "
        "end before the drain, which is signalled 30s before the end, and may come up to 1m "
        "early; ask for at least 2m30s\n"
    )
    short = p.stdout.strip()
    wait_for(lambda: any(m["alive"] for m in managers_json(root)), 90, 0.5)
    [m] = managers_json(root)
    # the manager knows Slurm's end, and uses what is left before the earliest drain
    assert m["allocation_end"] is not None and m["usable_end"] is not None
    assert float(m["allocation_end"]) - float(m["usable_end"]) == 90.0  # type: ignore[arg-type]
    assert 0 <= float(m["usable_left"]) <= 30  # type: ignore[arg-type]
    wait_for(lambda: status(root)["blocked"] != [], 20, 0.5)
    [blocked] = status(root)["blocked"]  # type: ignore[misc]
    assert re.fullmatch(
        r"needs 1m; the longest remaining manager time is \d+s; "
        r"submit allocations of at least 3m",
        blocked["reason"],
    ), blocked
    assert blocked["walltime"] == 180.0
    assert job(root, jid).state is State.READY and job(root, jid).attempts == []

    scale = ["--time", "2m", "--drain", "30s", "--max-time", "4m", "--max", "1"]
    reports = scale_until(root, scale, lambda: job(root, jid).state is State.SUCCEEDED, 170)
    submitted = [r for r in reports if r["submitted"]]
    assert len(submitted) == 1, reports
    assert submitted[0]["walltime"] == 180.0  # 60 s + 30 s drain + 60 s margin + 30 s start
    info = job(root, jid)
    assert len(info.attempts) == 1, dump(root)
    assert not any(f.get("why") == "interrupted" for f in info.frames), dump(root)
    # and the short allocation registered it but never claimed it
    log = Path(root) / ".flow" / "allocations" / "logs"
    [short_log] = log.glob(f"*-{short}.out")
    assert f"{jid} submitted -> ready" in short_log.read_text()
    assert "-> claimed" not in short_log.read_text()


def test_work_that_fits_no_allocation_is_blocked_and_max_time_gets_it_done(
    root: str, scripts: Path, cluster: Cluster, tmp_path: Path
) -> None:
    program = write_script(scripts, "quick.sh", "sleep 2\n")
    lines = [orjson.dumps({"tag": f"q{i}", "time": "2m", "args": []}).decode() for i in range(3)]
    jsonl = tmp_path / "jobs.jsonl"
    jsonl.write_text("\n".join(lines) + "\n")
    r = flow("-w", root, "submit", "--from", str(jsonl), program)
    assert r.returncode == 0, r.stderr
    first = cluster.next_job_id()

    # 2m allocations leave nothing for 2m of work: no demand, nothing submitted, said why
    base = ["--time", "2m", "--drain", "30s"]
    p = flow("scale", "-w", root, "--backend", "slurm", "--once", "--json", *base)
    assert p.returncode == 0, p.stderr
    rep = orjson.loads(p.stdout)
    assert (rep["desired"], rep["submitted"], rep["unfit"]) == (0, [], 3), rep
    assert rep["unfit_reason"] == (
        "need up to 2m, more than an allocation of 2m leaves before its drain; "
        "give --max-time 4m or more"
    )
    assert cluster.since(first) == []

    # a manager that cannot fit them: they are blocked with the reason and the numbers
    p = flow("sbatch", "-w", root, *base)
    assert p.returncode == 0, p.stderr
    wait_for(lambda: status(root)["counts"]["ready"] == 3, 90, 0.5)  # type: ignore[index]
    wait_for(lambda: status(root)["blocked"] != [], 20, 0.5)
    [blocked] = status(root)["blocked"]  # type: ignore[misc]
    assert blocked["count"] == 3
    assert re.fullmatch(
        r"needs 2m; the longest remaining manager time is \d+s; "
        r"submit allocations of at least 4m",
        blocked["reason"],
    ), blocked
    assert blocked["needs"] == 120.0 and blocked["walltime"] == 240.0

    # allowed up to 10m, the reconciler asks for what fits (4m) and the work is done
    def finished() -> bool:
        return {j.state for j in all_jobs(root)} == {State.SUCCEEDED}

    reports = scale_until(root, [*base, "--max-time", "10m", "--max", "1"], finished, 170)
    submitted = [r for r in reports if r["submitted"]]
    assert [r["walltime"] for r in submitted] == [240.0], reports
    assert all(r["unfit"] == 0 for r in reports[1:]), reports

    def record() -> dict[str, object]:
        allocs = orjson.loads(flow("-w", root, "allocations", "--all", "--json").stdout)
        [rec] = allocs["allocations"]
        return dict(rec)

    # its manager's heartbeat says how many attempts it started (every third of a lease)
    scale_until(root, [*base, "--max", "1"], lambda: record()["attempts"] == 3, 60)
    assert record()["time"] == 240.0
