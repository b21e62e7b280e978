"""Liveness never trusts a clock it cannot check (docs/protocol.md §8): on this host a
manager lives as long as its process; elsewhere it is gone once its heartbeat is seen to stop
changing. Moved heartbeat stamps, frozen managers and leases too short to keep are tested
with real manager processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from helpers import wait_for
from hostile.test_clock_skew import (
    GRACE,
    LEASE,
    evidence,
    faketime_env,
    lived_through_takeover_graces,
    long_jobs,
    untouched,
)

from httk_flow.manager.owners import OwnerOracle
from httk_flow.protocol.leases import FsClock, ManagerInfo, read_managers, write_heartbeat
from httk_flow.protocol.procs import proc_start_time
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

from .support import (
    FLOW,
    ManagerProcess,
    Managers,
    beats,
    dump,
    flow,
    heartbeat_of,
    job,
    log_of,
)

HOURS = 2 * 3600.0

#: `flow` whose heartbeat renames take 0.3 s (a slow shared filesystem)
SLOW_HEARTBEATS = (
    "import os, time\n"
    "from httk_flow.protocol import fsio\n"
    "class Slow(fsio.FileSystem):\n"
    "    def rename(self, src, dst):\n"
    "        if dst.endswith('heartbeat.json'):\n"
    "            time.sleep(0.3)\n"
    "        os.rename(src, dst)\n"
    "fsio.set_filesystem(Slow())\n"
    "from httk_flow.cli.main import main; main()\n"
)


def heartbeat_file(root: str, p: ManagerProcess) -> Path:
    body = wait_for(lambda: heartbeat_of(root, p), 20)
    assert isinstance(body, dict)
    return Path(root) / ".flow" / "managers" / str(body["id"]) / "heartbeat.json"


@pytest.mark.parametrize("shift", [-HOURS, HOURS], ids=["past", "future"])
def test_live_heartbeats_whose_mtimes_keep_being_moved_hours_away_keep_their_work(
    root: str, scripts: Path, managers: Managers, shift: float
) -> None:
    here, here_m, here_id = long_jobs(root, scripts, managers, 1, pool="p1")
    there, there_m, there_id = long_jobs(root, scripts, managers, 1, pool="p2", host="node-a")
    # the watcher serves neither pool: it can only recover, never run, their work
    watcher = managers.start(root, "--lease", LEASE, "--pool", "other", command="serve")
    beats_here, beats_there = heartbeat_file(root, here_m), heartbeat_file(root, there_m)

    def moved_and_long_enough() -> bool:
        t = time.time() + shift
        for beat in (beats_here, beats_there):
            with contextlib.suppress(OSError):  # rewritten this very moment
                os.utime(beat, (t, t))
        return all(beats(root, p) >= 15 for p in (watcher, here_m, there_m))

    wait_for(moved_and_long_enough, 60)
    untouched(root, here, here_id)
    untouched(root, there, there_id)
    for p in (here_m, there_m, watcher):
        assert p.poll() is None, log_of(p)


@pytest.mark.parametrize("host", [None, "node-a"], ids=["this-host", "other-host"])
def test_a_dead_managers_heartbeat_hours_in_the_future_does_not_keep_its_work(
    root: str, scripts: Path, managers: Managers, host: str | None
) -> None:
    jids, dead, owner = long_jobs(root, scripts, managers, 1, host=host)
    beat = heartbeat_file(root, dead)
    dead.kill()
    dead.wait()
    future = time.time() + HOURS
    os.utime(beat, (future, future))
    watcher = managers.start(root, "--lease", LEASE, command="serve")
    wait_for(lambda: evidence(job(root, jids[0])), GRACE + 10)
    [proof] = evidence(job(root, jids[0]))[:1]
    want = "lease_expired" if host else "process_gone"
    assert proof["owner"] == owner and proof["evidence"] == want, proof
    wait_for(lambda: job(root, jids[0]).state is State.SUCCEEDED, 30)
    assert watcher.poll() is None, log_of(watcher)


def test_a_frozen_manager_on_this_host_keeps_its_work_until_its_process_dies(
    root: str, scripts: Path, managers: Managers
) -> None:
    jids, frozen, owner = long_jobs(root, scripts, managers, 2)
    watcher = managers.start(root, "--lease", LEASE, "--pool", "other", command="serve")
    frozen.send_signal(signal.SIGSTOP)
    try:
        lived_through_takeover_graces(root, [watcher])
        untouched(root, jids, owner)
    finally:
        frozen.send_signal(signal.SIGKILL)
        frozen.wait()
    wait_for(lambda: all(evidence(job(root, j)) for j in jids), GRACE + 10)
    for jid in jids:
        assert evidence(job(root, jid))[0]["evidence"] == "process_gone", dump(root, [jid])


def test_a_manager_on_this_host_that_wrote_stopped_but_still_runs_keeps_its_work(
    root: str, scripts: Path, managers: Managers
) -> None:
    """ "stopped" and a live process: it is finishing its exit, not gone."""
    jids, live, owner = long_jobs(root, scripts, managers, 1)
    (heartbeat_file(root, live).parent / "stopped").touch()
    watcher = managers.start(root, "--lease", LEASE, "--pool", "other", command="serve")
    lived_through_takeover_graces(root, [watcher])
    untouched(root, jids, owner)
    assert live.poll() is None, log_of(live)


def test_leases_below_the_floor_are_refused(tmp_path: Path) -> None:
    r = flow("init", str(tmp_path / "ws"), "--lease", "0.001")
    assert r.returncode == 2, r
    assert r.stderr.startswith("flow: error: --lease: a lease of 0.001 s is below the floor")
    assert not (tmp_path / "ws" / ".flow").exists()

    assert flow("init", str(tmp_path / "ws"), "--lease", "1s").returncode == 0
    r = flow("serve", "-w", str(tmp_path / "ws"), "--lease", "0.5s")
    assert r.returncode == 2, r
    assert "flow: error: --lease: a lease of 0.5 s is below the floor of 1 s" in r.stderr
    assert not list((tmp_path / "ws" / ".flow" / "managers").iterdir())

    # a workspace whose policy was edited below the floor is refused when read
    fmt = tmp_path / "ws" / ".flow" / "format.json"
    doc = json.loads(fmt.read_text())
    doc["policy"]["lease"] = 0.25
    fmt.write_text(json.dumps(doc))
    r = flow("status", "-w", str(tmp_path / "ws"))
    assert r.returncode == 2, r
    assert "policy key lease: a lease of 0.25 s is below the floor of 1 s" in r.stderr


def test_a_heartbeat_slower_than_a_sixth_of_the_lease_refuses_to_start(tmp_path: Path) -> None:
    root = str(tmp_path / "ws")
    Workspace.create(root).close()
    slow = [sys.executable, "-c", SLOW_HEARTBEATS]
    r = subprocess.run(
        [*slow, "run", "-w", root, "--lease", "1s"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2, r
    assert r.stderr.startswith("flow: error: "), r.stderr
    assert "more than a sixth of the 1 s lease" in r.stderr and "raise --lease" in r.stderr
    # a lease the same filesystem can keep: it serves (and exits, idle)
    r = subprocess.run(
        [*slow, "run", "-w", root, "--lease", "3s", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r


#: the filesystem's time, the shared clock and the skew as a faked process measures them
MEASURE = (
    "import json, sys, time\n"
    "from httk_flow.protocol.leases import FsClock, fs_now\n"
    "from httk_flow.protocol.workspace import Workspace\n"
    "ws = Workspace.open(sys.argv[1])\n"
    "c = FsClock(ws)\n"
    "print(json.dumps({'fs': fs_now(ws), 'shared': c.now(), 'skew': c.skew,"
    " 'local': time.time()}))\n"
)


@pytest.mark.parametrize("offset", ["+2h", "-2h"])
def test_the_filesystem_clock_is_a_new_files_stamp_even_under_a_faked_clock(
    tmp_path: Path, offset: str
) -> None:
    env = faketime_env(offset, tmp_path)
    root = str(tmp_path / "ws")
    Workspace.create(root).close()
    r = subprocess.run(
        [sys.executable, "-c", MEASURE, root],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
    )
    assert r.returncode == 0, r
    seen = json.loads(r.stdout)
    now = time.time()
    sign = -1 if offset.startswith("-") else 1
    assert abs(seen["fs"] - now) < 10, seen
    assert abs(seen["shared"] - now) < 10, seen
    assert abs(seen["skew"] - sign * HOURS) < 10, seen
    assert abs(seen["local"] - now - sign * HOURS) < 10, seen


def test_one_read_judges_this_host_by_process_and_other_hosts_by_filesystem_stamps(
    tmp_path: Path,
) -> None:
    ws = Workspace.create(str(tmp_path / "ws"))
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        start = proc_start_time(sleeper.pid) or 0
        dead = subprocess.Popen(["true"])
        dead.wait()
        infos = [
            ManagerInfo("mlive", ws.host, sleeper.pid, 0.0, lease=1, start_time=start),
            ManagerInfo("mgone", ws.host, dead.pid, 0.0, lease=1),
            ManagerInfo("mfar", "node-z", 1, 0.0, lease=1),
            ManagerInfo("mmoved", "node-z", 1, 0.0, lease=1),
        ]
        for info in infos:
            d = Path(ws.managers) / info.id
            d.mkdir()
            (d / "heartbeat.json").write_bytes(info.to_json())
        old = time.time() - HOURS
        for mid in ("mlive", "mgone", "mmoved"):
            os.utime(Path(ws.managers) / mid / "heartbeat.json", (old, old))
        (Path(ws.managers) / "mlive" / "stopped").touch()  # exiting, not yet gone
        by_id = {lv.info.id: lv for lv in read_managers(ws)}
        assert by_id["mlive"].alive and by_id["mlive"].process is True
        assert not by_id["mgone"].alive and by_id["mgone"].evidence == "process_gone"
        assert by_id["mfar"].alive and by_id["mfar"].age < 5
        # a utime() moves the mtime, not the ctime the filesystem stamped just now
        assert by_id["mmoved"].alive and by_id["mmoved"].age < 5

        # read with a filesystem clock hours on: the other host's manager is gone
        later = FsClock(ws).now() + HOURS
        far = {lv.info.id: lv for lv in read_managers(ws, now=later)}["mfar"]
        assert not far.alive and far.evidence == "lease_expired"
        # and hours behind: a heartbeat from the future says nothing (shown as such)
        earlier = FsClock(ws).now() - HOURS
        far = {lv.info.id: lv for lv in read_managers(ws, now=earlier)}["mfar"]
        assert far.alive and far.future and far.age < 0 and not far.age_known
        assert far.evidence is None
    finally:
        sleeper.kill()
        sleeper.wait()
        ws.close()


def test_the_oracle_counts_only_the_silence_it_watched(tmp_path: Path) -> None:
    """Silence is measured on the reader's monotonic clock (a test clock here), and only
    while it keeps looking: after a gap in its reads everyone is watched anew."""
    ws = Workspace.create(str(tmp_path / "ws"), lease=1)
    t = [0.0]
    oracle = OwnerOracle(ws, "mme", refresh=0.5, lease=1.0, clock=lambda: t[0])
    far = ManagerInfo("mfar", "node-z", 1, 0.0, lease=1)
    try:
        write_heartbeat(ws, far)
        assert oracle.gone("mfar") is None
        t[0] = 1.0
        assert "mfar" in oracle.suspects() and oracle.gone("mfar") is None
        t[0] = 2.0
        assert oracle.gone("mfar") == "lease_expired"
        # it beats again: alive, and suspected no more
        write_heartbeat(ws, ManagerInfo("mfar", "node-z", 1, 0.0, lease=1, seq=1))
        t[0] = 2.5
        assert oracle.gone("mfar") is None and "mfar" not in oracle.suspects()
        # this reader looked away for longer than a grace: nothing it saw counts
        t[0] = 10.0
        assert oracle.gone("mfar") is None
        for step in (10.5, 11.0, 11.5):
            t[0] = step
            assert oracle.gone("mfar") is None
        t[0] = 12.0
        assert oracle.gone("mfar") == "lease_expired"
    finally:
        ws.close()


def test_old_heartbeats_without_a_sequence_number_still_read() -> None:
    raw = orjson.dumps({"id": "mold", "host": "h", "pid": 7, "started": 1.0, "lease": 30})
    info = ManagerInfo.from_json(raw, "heartbeat.json")
    assert info.seq == 0 and info.lease == 30.0
    assert ManagerInfo.from_json(ManagerInfo("m", "h", 1, 0.0, seq=5).to_json(), "x").seq == 5


def test_flow_managers_shows_the_filesystem_age(root: str, managers: Managers) -> None:
    p = managers.start(root, "--lease", LEASE, command="serve")
    heartbeat_file(root, p)
    r = subprocess.run([*FLOW, "managers", "-w", root, "--json"], capture_output=True, text=True)
    [m] = json.loads(r.stdout)["managers"]
    assert m["alive"] is True and 0 <= m["heartbeat_age"] < 5, m
