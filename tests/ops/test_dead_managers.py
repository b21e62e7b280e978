"""A manager killed with `kill -9` while it runs a job, as `flow status`, `flow managers`
and `flow cancel` tell it: which jobs the dead manager holds, when the next manager
recovers them, what a cancellation of one does, and the allocation each manager ran in."""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import socket
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_for
from manager.support import ManagerProcess, Managers, log_of, manager_up

from httk_flow.ops import managers as listing
from httk_flow.protocol.leases import Liveness, ManagerInfo, read_managers, write_heartbeat
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

from .support import Flow, live_processes, wait_state, write_script

HOST = socket.gethostname()
#: the CPUs a manager started here finds (its affinity mask)
NCPU = len(os.sched_getaffinity(0))
START_ONE = "start one with `flow serve` or `flow run`"

#: touches $FLOW_WORKDIR/started, then sleeps far longer than any test
SLEEPER = """#!/bin/sh
touch "$FLOW_WORKDIR/started"
exec sleep 300
"""

#: what `squeue -h -j ID -o %e|%L` answers inside an allocation that ends at 2031-01-02 03:04
FAKE_SQUEUE = """#!/bin/sh
echo "2031-01-02T03:04:05|100-00:00:00"
"""


def aged(text: str) -> list[str]:
    """The lines of `text` with heartbeat ages replaced by `N ago`."""
    return [re.sub(r"\b\d+(\.\d+)?s ago\b", "N ago", line) for line in text.splitlines()]


def cells(text: str) -> list[str]:
    """Each line of a plain table with its columns joined by ` | ` (they are two or more
    spaces apart) and heartbeat ages replaced: whole lines to compare."""
    return [re.sub(r" {2,}", " | ", line) for line in aged(text)]


def start_sleeper(
    flow: Flow, managers: Managers, scripts: Path, tag: str, *args: str, **start: Any
) -> tuple[dict[str, str], ManagerProcess, str]:
    """Submit one sleeping job and serve it with one worker until it has started: the job,
    its manager and the manager's id."""
    job = flow.submit("--tag", tag, *args, write_script(scripts, "sleeper.sh", SLEEPER))
    p = managers.start(flow.root, command="serve", workers=1, **start)
    mid = manager_up(flow.root, p)
    wait_for(lambda: flow.state(tag) == "running" or p.poll() is not None, 20)
    assert p.poll() is None, log_of(p)
    return job, p, mid


def kill_9(p: ManagerProcess) -> None:
    p.send_signal(signal.SIGKILL)
    assert p.wait(10) == -signal.SIGKILL


def managers_json(flow: Flow, *args: str) -> dict[str, dict[str, Any]]:
    return {m["id"]: m for m in flow.json("managers", *args)["managers"]}


def status_when(flow: Flow, line: str) -> str | None:
    """`flow status` once its text has this line, else None."""
    text = flow.ok("status")
    return text if line in text.splitlines() else None


def pgid_of(flow: Flow, tag: str) -> int:
    [running] = [f for f in flow.history(tag) if f["to"] == "running"]
    return int(running["attempt"]["pgid"])


def test_a_killed_managers_job_is_named_in_status_and_managers_until_the_next_recovers_it(
    flow: Flow, managers: Managers, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, p, mid = start_sleeper(flow, managers, scripts, "held")
    pid = p.pid
    kill_9(p)

    held = (
        f"  1 running job held by dead manager {mid} on this host; "
        "the next manager here recovers it at once"
    )
    assert flow.ok("status").splitlines() == [
        f"workspace {flow.root}: 1 jobs",
        "STATE      JOBS",
        "ready      0",
        "running    1",
        "succeeded  0",
        "failed     0",
        "managers: 0 live, 1 dead",
        held,
        f"  no live manager to recover it; {START_ONE}",
    ]
    status = flow.json("status")
    assert status["held_by_dead"] == [
        {
            "manager": mid,
            "host": HOST,
            "jobs": 1,
            "states": {"running": 1},
            "recovers": "at_once",
            "recover_at": None,
        }
    ]
    assert [(m["id"], m["alive"]) for m in status["managers"]] == [(mid, False)]
    # the running count is the jobs it holds, not what its last heartbeat said
    assert cells(flow.ok("managers")) == [
        "ID | HOST | PID | ALLOC | STATE | HEARTBEAT | RUNNING | IN USE | USABLE | ENDS | POOLS",
        f"{mid} | {HOST} | {pid} | - | dead (holds 1 job) | N ago | 1/1 | - | 0s left | - | "
        "default",
    ]
    dead = managers_json(flow)[mid]
    assert (dead["state"], dead["holds"], dead["running"], dead["allocation"]) == (
        "dead (holds 1 job)",
        1,
        1,
        None,
    )

    # the next manager on this host takes it over at once and runs it again
    q = managers.start(flow.root, "--lease", "3s", command="serve", workers=1)
    new = manager_up(flow.root, q)
    wait_for(lambda: managers_json(flow)[mid]["holds"] == 0 or q.poll() is not None, 20)
    wait_for(lambda: managers_json(flow)[new]["running"] == 1 or q.poll() is not None, 20)
    assert q.poll() is None, log_of(q)
    assert wait_state(flow, "held", {"running"}) == "running"
    assert [a["n"] for a in flow.show("held")["attempts"]] == [1, 2]
    assert cells(flow.ok("managers")) == [
        "ID | HOST | PID | ALLOC | STATE | HEARTBEAT | RUNNING | IN USE | USABLE | ENDS | POOLS",
        f"{new} | {HOST} | {q.pid} | - | alive | N ago | 1/1 | 1/{NCPU} CPUs | - | - | default",
        f"{mid} | {HOST} | {pid} | - | dead (work recovered) | N ago | 0/1 | - | 0s left | - | "
        "default",
    ]
    assert aged(flow.ok("status"))[-2:] == [
        "managers: 1 live, 1 dead",
        f"  {new} on {HOST} pid {q.pid}, 1/1 running, heartbeat N ago",
    ]
    assert flow.json("status")["held_by_dead"] == []

    # heard from longer ago than the bound and holding nothing: only --all lists it
    monkeypatch.setattr(listing, "FORGET_AFTER", 0.5)
    wait_for(lambda: managers_json(flow, "--all")[mid]["heartbeat_age"] > 0.5, 10)
    assert list(managers_json(flow)) == [new]
    assert set(managers_json(flow, "--all")) == {new, mid}
    assert managers_json(flow, "--all")[mid]["state"] == "dead (work recovered)"
    assert [m["id"] for m in flow.json("status")["managers"]] == [new]
    assert flow.ok("status").splitlines()[-2] == "managers: 1 live"
    q.terminate()
    assert q.wait(20) == 0, log_of(q)
    assert job["key"].startswith("held--")


@pytest.mark.parametrize("orphan", ["alive", "gone"])
def test_cancelling_a_job_of_a_killed_manager_says_who_finishes_it_and_how(
    flow: Flow, managers: Managers, scripts: Path, orphan: str
) -> None:
    job, p, mid = start_sleeper(flow, managers, scripts, "held")
    pgid = pgid_of(flow, "held")
    wait_for(lambda: live_processes(pgid=pgid), 10)
    kill_9(p)
    # a manager killed with -9 leaves its attempt's process group running
    assert live_processes(pgid=pgid)
    if orphan == "gone":
        os.killpg(pgid, signal.SIGKILL)
        wait_for(lambda: not live_processes(pgid=pgid), 10)
        fate = (
            f"its manager {mid} is dead and its process is gone: the next manager here marks "
            "it cancelled at once"
        )
    else:
        fate = (
            f"its manager {mid} is dead and its process group {pgid} still runs on this "
            "host: the next manager here kills it (KILL) and marks the job cancelled"
        )
    out = flow.ok("cancel", "held")
    assert out == (
        f"{job['key']}: running -> cancelling ({fate}; no manager is running: {START_ONE})\n"
    )
    # the CLI fenced it and nothing more: the group runs on until a manager comes
    assert bool(live_processes(pgid=pgid)) is (orphan == "alive")
    assert flow.state("held") == "cancelling"
    assert cells(flow.ok("managers"))[1].split(" | ")[4] == "dead (holds 1 job)"

    assert managers.run(flow.root) == 0
    assert flow.state("held") == "cancelled"
    assert live_processes(pgid=pgid) == []
    last = flow.history("held")[-1]
    assert (last["evidence"]["owner"], last["evidence"]["evidence"]) == (mid, "process_gone")
    assert ("killed" in last["evidence"]) is (orphan == "alive")
    assert cells(flow.ok("managers"))[1].split(" | ")[4] == "dead (work recovered)"


def test_a_manager_dead_on_another_host_is_recovered_once_its_lease_expires(
    flow: Flow, managers: Managers, scripts: Path
) -> None:
    flow.submit("--tag", "iso", "--workdir", "isolated", write_script(scripts, "s.sh", SLEEPER))
    flow.submit("--tag", "kept", write_script(scripts, "s.sh", SLEEPER))
    p = managers.start(flow.root, "--lease", "3s", command="serve", workers=2, host="node-b")
    mid = manager_up(flow.root, p)
    wait_for(lambda: flow.json("status")["counts"]["running"] == 2 or p.poll() is not None, 20)
    assert p.poll() is None, log_of(p)
    kill_9(p)

    kept = (
        f"  1 running job held by dead manager {mid} on host node-b; not recovered on lease "
        "expiry (persistent workdir): start a manager on node-b, or cancel it"
    )
    expiring = re.compile(
        rf"  1 running job held by dead manager {mid} on host node-b; recovered once its "
        r"lease expires in ~[1-6]s \(at \d\d:\d\d:\d\d\) and a manager has watched that "
        r"heartbeat for 3s"
    )
    # silent for more than its 3 s lease, not yet for its 6 s takeover grace
    text = wait_for(lambda: status_when(flow, "managers: 0 live, 1 dead"), 20)
    lines = str(text).splitlines()
    assert lines[-4:-2] == ["managers: 0 live, 1 dead", kept]
    assert expiring.fullmatch(lines[-2]) or "its lease expired" in lines[-2], lines[-2]
    assert lines[-1] == f"  no live manager to recover them; {START_ONE}"
    [stuck, soon] = flow.json("status")["held_by_dead"]
    assert (stuck["recovers"], stuck["recover_at"]) == ("its_host", None)
    assert soon["recovers"] == "lease_expiry" and soon["host"] == "node-b"
    beat = Path(flow.root) / ".flow" / "managers" / mid / "heartbeat.json"
    last = max(beat.stat().st_mtime, beat.stat().st_ctime)
    assert soon["recover_at"] == pytest.approx(last + 6, abs=1.5)

    # past the grace: the next manager takes it over once it has watched for a lease
    expired = re.compile(
        rf"  1 running job held by dead manager {mid} on host node-b; its lease expired at "
        r"\d\d:\d\d:\d\d: a manager recovers it once it has watched that heartbeat for 3s"
    )
    wait_for(lambda: expired.fullmatch(flow.ok("status").splitlines()[-2]), 20)
    out = flow.ok("cancel", "kept")
    assert re.fullmatch(
        rf"kept--[0-9a-f]{{32}}: running -> cancelling \(its manager {mid} on node-b is dead "
        r"\(its lease expired at \d\d:\d\d:\d\d\): the next manager marks it cancelled once it "
        r"has watched that heartbeat for 3s; only a manager on node-b stops its process "
        rf"there; no manager is running: {re.escape(START_ONE)}\)\n",
        out,
    ), out
    [both] = flow.json("status")["held_by_dead"]
    assert (both["states"], both["recovers"]) == ({"running": 1, "cancelling": 1}, "lease_expiry")


def test_a_manager_in_an_allocation_shows_its_batch_job_and_end(
    flow: Flow, managers: Managers, scripts: Path, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    write_script(bin_dir, "squeue", FAKE_SQUEUE)
    env = {"SLURM_JOB_ID": "4242", "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    job, p, mid = start_sleeper(flow, managers, scripts, "held", env=env)
    header, row = cells(flow.ok("managers"))
    assert header.split(" | ")[3:] == [
        "ALLOC",
        "STATE",
        "HEARTBEAT",
        "RUNNING",
        "IN USE",
        "USABLE",
        "ENDS",
        "POOLS",
    ]
    alloc, state, _, _, _, usable, ends, pools = row.split(" | ")[3:]
    assert (alloc, state, ends, pools) == ("slurm:4242", "alive", "2031-01-02 03:04", "default")
    assert re.fullmatch(r"\d+d(\d+h)?(\d+m)? left", usable), usable
    [m] = flow.json("managers")["managers"]
    assert m["allocation"] == {"backend": "slurm", "id": "4242"}
    assert m["allocation_end"] == pytest.approx(_local("2031-01-02T03:04:05"))
    kill_9(p)
    header, row = cells(flow.ok("managers"))
    assert row.split(" | ") == [
        mid,
        HOST,
        str(p.pid),
        "slurm:4242",
        "dead (holds 1 job)",
        "N ago",
        "1/1",
        "-",
        "0s left",
        "2031-01-02 03:04",
        "default",
    ]
    assert job["key"].startswith("held--")


def _local(stamp: str) -> float:
    return dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S").timestamp()


def test_a_heartbeat_names_the_batch_job_its_environment_says_and_old_ones_still_read(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOW_ALLOCATION_ID", "pbs:77.server")
    write_heartbeat(ws, ManagerInfo("mone", HOST, 1, 0.0, seq=1))
    monkeypatch.delenv("FLOW_ALLOCATION_ID")
    write_heartbeat(ws, ManagerInfo("mtwo", HOST, 1, 0.0, seq=1))
    found = {lv.info.id: lv.info.allocation_id for lv in read_managers(ws)}
    assert found == {"mone": ("pbs", "77.server"), "mtwo": None}
    for raw in (
        b'{"id": "m", "host": "h", "pid": 7, "started": 1.0}',
        b'{"id": "m", "host": "h", "pid": 7, "started": 1.0, "allocation_id": 12}',
        b'{"id": "m", "host": "h", "pid": 7, "started": 1.0, "allocation_id": {"id": "1"}}',
    ):
        assert ManagerInfo.from_json(raw, "heartbeat.json").allocation_id is None


def _gone(mid: str, age: float, *, started: float = 0.0, age_known: bool = True) -> Liveness:
    """A manager on another host as a one-shot read sees it: silent for `age` seconds."""
    info = ManagerInfo(mid, "node-b", 7, started, lease=30.0)
    alive = age <= 30.0
    return Liveness(info, age, alive=alive, stopped=False, age_known=age_known)


@pytest.mark.parametrize(
    ("age", "watcher_since", "age_known", "said", "at"),
    [
        (
            40,
            None,
            True,
            "recovered once its lease expires in ~20s (at 12:00:20) and a "
            "manager has watched that heartbeat for 30s",
            20,
        ),
        (40, 100, True, "recovered once its lease expires in ~20s (at 12:00:20)", 20),
        # a manager that started 5 s ago watches for a whole lease first
        (40, 5, True, "recovered once its lease expires in ~25s (at 12:00:25)", 25),
        (
            90,
            None,
            True,
            "its lease expired at 11:59:30: a manager recovers it once it has "
            "watched that heartbeat for 30s",
            -30,
        ),
        (90, 100, True, "its lease expired at 11:59:30: a running manager recovers it now", -30),
        (
            40,
            None,
            False,
            "recovered once a running manager has seen its heartbeat unchanged for 1m",
            None,
        ),
    ],
)
def test_a_lease_wait_is_said_as_the_one_shot_rule_would_take_over(
    ws: Workspace,
    age: float,
    watcher_since: float | None,
    age_known: bool,
    said: str,
    at: float | None,
) -> None:
    now = dt.datetime.now().replace(hour=12, minute=0, second=0, microsecond=0).timestamp()
    dead = _gone("mdead", age, age_known=age_known)
    by_id = {"mdead": dead}
    if watcher_since is not None:
        watcher = ManagerInfo("mlive", HOST, 8, now - watcher_since, lease=30.0)
        by_id["mlive"] = Liveness(watcher, 1.0, alive=True, stopped=False)
    held = {"mdead": listing.Holding(Counter({State.RUNNING: 1}), "node-b")}
    [hold] = listing.dead_holds(ws, held, by_id, now)
    assert hold.describe(now) == (
        f"1 running job held by dead manager mdead on host node-b; {said}"
    )
    assert hold.recover_at == (None if at is None else pytest.approx(now + at))
    assert hold.to_json()["recovers"] == "lease_expiry"
