"""A manager whose workers wait registers one batch of submitted jobs, then claims: with
more jobs submitted than a batch, the first one runs before the last is registered, not
after every one of them (they register while it runs, a full budget at a time)."""

from __future__ import annotations

from pathlib import Path

import orjson

from httk_flow.protocol.jobs import REGISTER_BATCH

from .support import Managers, all_jobs, flow, log_of, whole_log

JOBS = 3 * REGISTER_BATCH + 10


def test_the_first_job_runs_before_the_last_is_registered(
    root: str, tmp_path: Path, managers: Managers
) -> None:
    r = flow("-w", root, "submit", "--array", f"1-{JOBS}", "/bin/true")
    assert r.returncode == 0, r.stderr
    p = managers.start(root, "--log-format", "json", command="run", quiet=False, workers=1)
    assert p.wait(120) == 0, log_of(p)
    moves = [
        (m["from"], m["to"])
        for m in map(orjson.loads, whole_log(p).splitlines())
        if m.get("event") == "transition"
    ]
    registered = [i for i, m in enumerate(moves) if m == ("submitted", "ready")]
    first_run = moves.index(("claimed", "running"))
    assert len(registered) == JOBS
    # at most one batch (a budget of entries, shard directories among them), then the
    # claim: the rest register after it, while the job runs
    before = sum(1 for i in registered if i < first_run)
    assert 0 < before <= REGISTER_BATCH, (before, first_run)
    assert {j.state.value for j in all_jobs(root)} == {"succeeded"}
