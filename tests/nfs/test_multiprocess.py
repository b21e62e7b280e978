"""Managers in separate processes, each seeing the workspace through an NFS model (installed
by nfs_flow.py), sharing one workspace: every job runs exactly once and none is lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from helpers import wait_for
from hostile.support import handle_of, job_now, plant_frame
from manager.support import (
    ManagerProcess,
    Managers,
    beats,
    dump,
    log_of,
    marker_keys,
    submit,
    write_script,
)

from httk_flow.protocol import jobs
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

NFS_FLOW = str(Path(__file__).with_name("nfs_flow.py"))

#: appends its job id to the shared file $FLOW_PARAM_runs (one line per execution); its
#: first attempt takes $FLOW_PARAM_sleep seconds (the scene: a job that runs a while), any
#: later one ends at once. With $FLOW_PARAM_gate it first notes its manager's pid ($PPID,
#: the manager that launched it) in $FLOW_PARAM_holders and waits for the gate file
COUNTED = r"""
echo "$FLOW_JOB_ID $FLOW_ATTEMPT_ID" >> "$FLOW_PARAM_runs"
if [ -n "${FLOW_PARAM_gate:-}" ]; then
    echo "$PPID" >> "$FLOW_PARAM_holders"
    until [ -e "$FLOW_PARAM_gate" ]; do sleep 0.05; done
fi
[ "$FLOW_ATTEMPT_ID" = a0001 ] && sleep "${FLOW_PARAM_sleep:-0.3}"
publish '{"action":"succeed"}'
"""


def start(
    managers: Managers, root: str, host: str, model: dict[str, object], *args: str
) -> ManagerProcess:
    """`flow ARGS -w ROOT` through nfs_flow.py, as a manager on `host`, seeing `model`."""
    managers._n += 1
    log = managers.tmp / f"manager-{managers._n}.log"
    argv = [sys.executable, NFS_FLOW, host, args[0], "-w", root, "--quiet", *args[1:]]
    env = {**os.environ, "FLOW_TEST_NFS": json.dumps(model)}
    with open(log, "wb") as out:
        p = ManagerProcess(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    p.log = log
    managers.procs.append(p)
    managers.roots.add(root)
    return p


def model_counts(p: ManagerProcess) -> dict[str, int]:
    for line in log_of(p).splitlines():
        if line.startswith("nfs-model: "):
            return json.loads(line.removeprefix("nfs-model: "))  # type: ignore[no-any-return]
    raise AssertionError(f"no model counters in the log:\n{log_of(p)}")


def test_two_managers_through_late_names_and_lying_renames_run_each_job_once(
    root: str, scripts: Path, managers: Managers, tmp_path: Path
) -> None:
    runs, holders, gate = tmp_path / "runs", tmp_path / "holders", tmp_path / "gate"
    prog = write_script(scripts, "counted.sh", COUNTED)
    params = {"runs": str(runs), "holders": str(holders), "gate": str(gate)}
    ids = submit(root, prog, count=24, params=params)
    model = {"late": 0.5, "lying_renames": "markers"}
    ps = [
        start(managers, root, host, model, "run", "--workers", "2", "--idle", "3s")
        for host in ("node-a", "node-b")
    ]
    # both managers race for the markers: the first jobs hold their workers until each
    # manager runs one (a manager whose 2 workers are taken claims nothing more), so the
    # race does not depend on which manager the scheduler starts first
    pids = {str(p.pid) for p in ps}

    def holding() -> set[str]:
        return set(holders.read_text().split()) if holders.exists() else set()

    wait_for(lambda: holding() >= pids or any(p.poll() is not None for p in ps), 60)
    assert holding() >= pids, [log_of(p) for p in ps]
    gate.touch()
    for p in ps:
        assert p.wait(90) in (0, 1), log_of(p)
        assert "Traceback" not in log_of(p), log_of(p)
    executions = Counter(line.split()[0] for line in runs.read_text().splitlines())
    assert sorted(executions) == sorted(ids), "a job was lost"
    assert set(executions.values()) == {1}, executions
    assert set(marker_keys(root).values()) == {1}
    for jid in ids:
        assert job_now(root, jid).state is State.SUCCEEDED, dump(root, [jid])
    counts = [model_counts(p) for p in ps]
    assert all(c["lies"] > 0 for c in counts), counts
    assert sum(c["hidden"] for c in counts) > 0, counts
    served = Counter(job_now(root, j).attempts[0]["manager"] for j in ids)
    assert len(served) == 2, f"the gate let one manager serve everything: {served}"


def _plant_dead_manager_with_persistent_work(root: str, prog: str) -> None:
    """A manager that died long ago on another node, owning a running job whose persistent
    workdir it will not take over on lease age alone: it stays a suspect, so every live
    manager sweeps the active states on every tick."""
    [stuck] = submit(root, prog)
    d = Path(root) / ".flow" / "managers" / "mdeadlongago"
    d.mkdir(parents=True)
    hb = d / "heartbeat.json"
    hb.write_text(
        json.dumps({"id": "mdeadlongago", "host": "deadnode", "pid": 1, "started": 0, "lease": 1})
    )
    os.utime(hb, (time.time() - 3600, time.time() - 3600))
    ws = Workspace.open(root)
    try:
        h = plant_frame(ws, handle_of(ws, stuck), State.READY)
        h = plant_frame(ws, h, State.CLAIMED, **{"try": 1, "tries": 1})
        attempt = {"id": "a0001", "n": 1, "manager": "mdeadlongago", "host": "deadnode"}
        plant_frame(ws, h, State.RUNNING, attempt={**attempt, "pid": 4242, "pgid": 4242})
    finally:
        ws.close()


def test_a_manager_seen_late_keeps_its_running_job(
    root: str, scripts: Path, managers: Managers, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    prog = write_script(scripts, "counted.sh", COUNTED)
    _plant_dead_manager_with_persistent_work(root, prog)
    # A sees new names 0.2 s late, new manager directories 6 s late (the managers'
    # directory rarely changes, so A's client trusts its cached listing longest); A serves
    # the default pool only
    late = {"late": 0.2, "late_dirs": {f"{os.sep}.flow{os.sep}managers": 6}}
    a = start(managers, root, "node-a", late, "serve", "--lease", "1s", "--workers", "1")
    wait_for(lambda: len(list((Path(root) / ".flow" / "managers").iterdir())) >= 2, 20)
    # A has listed the managers once, so B's directory will be new to it: A's first
    # heartbeat writes seq 1 (up to 3 on a slow disk), then its loop heartbeats right
    # before its first reading of the managers; a seq of 5 comes after that reading
    wait_for(lambda: beats(root, a) >= 5 or a.poll() is not None, 20)
    assert a.poll() is None, log_of(a)
    [x] = submit(root, prog, pool="b", workdir="isolated", params={"runs": str(runs), "sleep": "4"})
    b = start(
        managers, root, "node-b", {}, "serve", "--pool", "b", "--lease", "1s", "--workers", "1"
    )
    wait_for(lambda: job_now(root, x).state is State.SUCCEEDED, 40)
    assert a.poll() is None and b.poll() is None, log_of(a) + log_of(b)
    takeovers = [f.get("evidence") for f in job_now(root, x).frames if "evidence" in f]
    assert not takeovers, takeovers
    assert [line.split()[0] for line in runs.read_text().splitlines()] == [x]


def test_the_late_model_reaches_the_oracle(root: str, scripts: Path) -> None:
    """Sanity check of the model the test above relies on: a manager directory created
    after the first listing is hidden from read_managers for the delay."""
    from httk_flow.protocol.fsio import set_filesystem
    from httk_flow.protocol.leases import read_managers

    from .faultfs import LateNames

    model = LateNames(late=30)
    set_filesystem(model)
    ws = Workspace.open(root)
    try:
        assert read_managers(ws) == []
        (Path(ws.managers) / "mnew").mkdir()
        (Path(ws.managers) / "mnew" / "heartbeat.json").write_text(
            json.dumps({"id": "mnew", "host": "h", "pid": 1, "started": 0})
        )
        assert read_managers(ws) == []
        assert model.hidden == 1
        assert not list(jobs.all_jobs(ws))
    finally:
        ws.close()
