"""Two managers serve one workspace: every job runs exactly once, whoever claims it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from httk_flow.protocol.states import State

from .support import Managers, all_jobs, log_of, submit, write_script

JOBS = 200


def test_two_managers_share_a_workspace_and_run_every_job_exactly_once(
    root: str, scripts: Path, managers: Managers, tmp_path: Path
) -> None:
    log = tmp_path / "ran.log"
    program = write_script(scripts, "append.sh", 'echo "$FLOW_JOB_ID" >> "$FLOW_PARAM_log"\n')
    ids = submit(root, program, count=JOBS, params={"log": str(log)})
    a = managers.start(root, workers=3)
    b = managers.start(root, workers=3)
    assert a.wait(120) == 0, log_of(a)
    assert b.wait(120) == 0, log_of(b)

    ran = Counter(log.read_text().split())
    assert ran == Counter(ids)  # every id once: nothing lost, nothing run twice
    infos = all_jobs(root)
    assert Counter(i.state for i in infos) == {State.SUCCEEDED: JOBS}
    assert all(len(i.attempts) == 1 for i in infos)
    owners = Counter(i.attempts[0]["manager"] for i in infos)
    assert len(owners) == 2, f"both managers should have run jobs: {owners}"
