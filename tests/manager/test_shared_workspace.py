"""Two managers serve one workspace: every job runs exactly once, whoever claims it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from helpers import wait_for

from httk_flow.protocol.states import State

from .support import Managers, all_jobs, log_of, submit, write_script

JOBS = 200

#: notes its id, and the manager that launched it ($PPID), then waits for the gate file
APPEND = """
echo "$FLOW_JOB_ID" >> "$FLOW_PARAM_log"
echo "$PPID" >> "$FLOW_PARAM_holders"
until [ -e "$FLOW_PARAM_gate" ]; do sleep 0.02; done
"""


def test_two_managers_share_a_workspace_and_run_every_job_exactly_once(
    root: str, scripts: Path, managers: Managers, tmp_path: Path
) -> None:
    log, holders, gate = tmp_path / "ran.log", tmp_path / "holders", tmp_path / "gate"
    program = write_script(scripts, "append.sh", APPEND)
    params = {"log": str(log), "holders": str(holders), "gate": str(gate)}
    ids = submit(root, program, count=JOBS, params=params)
    a = managers.start(root, workers=3)
    b = managers.start(root, workers=3)
    # the first jobs hold their workers until each manager runs one (a manager whose 3
    # workers are taken claims nothing more): both take part, whichever the scheduler
    # starts first; from then on they race for the rest
    pids = {str(a.pid), str(b.pid)}

    def holding() -> set[str]:
        return set(holders.read_text().split()) if holders.exists() else set()

    wait_for(lambda: holding() >= pids or a.poll() is not None or b.poll() is not None, 60)
    assert holding() >= pids, log_of(a) + log_of(b)
    gate.touch()
    assert a.wait(120) == 0, log_of(a)
    assert b.wait(120) == 0, log_of(b)

    ran = Counter(log.read_text().split())
    assert ran == Counter(ids)  # every id once: nothing lost, nothing run twice
    infos = all_jobs(root)
    assert Counter(i.state for i in infos) == {State.SUCCEEDED: JOBS}
    assert all(len(i.attempts) == 1 for i in infos)
    owners = Counter(i.attempts[0]["manager"] for i in infos)
    assert len(owners) == 2, f"the gate let one manager run everything: {owners}"
