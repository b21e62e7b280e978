"""Budgets against a real Slurm: a checkpointing job drained 150 times, advancing between
drains, spends nothing of its `--retries` (nor of `max_attempts`) and succeeds.

Inside one Slurm allocation the managers come and go as they do across allocations: each
runs until a TERM reaches it (as Slurm's `--signal` does before a walltime), drains its
attempt and exits, and the next one starts."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers import wait_for
from manager.support import dump, job, submit, write_script

from httk_flow.protocol.states import State

from .support import Cluster, flow_env, run

pytestmark = pytest.mark.slurm

DRAINS = 150

#: a fresh start of `main` waits to be drained; the start after a drain is a restart
#: (unclean: stopped from outside) and advances to a new activation of `main`, which
#: starts fresh; after DRAINS drains, `done` fails once (a charged failure) and succeeds
CHECKPOINTER = f"""#!/usr/bin/env bash
source "$FLOW_BASH_API"
flow_steps main done
step_main() {{
    if [ "$FLOW_UNCLEAN_RESTART" = 1 ]; then
        n=$(( $(cat "$FLOW_WORKDIR/n" 2>/dev/null || echo 0) + 1 ))
        echo "$n" > "$FLOW_WORKDIR/n"
        if (( n < {DRAINS} )); then flow_advance main "drain $n"; else flow_advance done; fi
    fi
    touch "$FLOW_WORKSPACE_DIR/asleep"
    exec sleep 300
}}
step_done() {{
    if [ ! -e "$FLOW_WORKDIR/failed-once" ]; then touch "$FLOW_WORKDIR/failed-once"; exit 3; fi
    flow_succeed "after $(cat "$FLOW_WORKDIR/n") drains"
}}
flow_main "$@"
"""

#: the allocation: short-lived managers one after another until the job has ended
MANAGERS = """#!/usr/bin/env bash
set -u
ws=$1
for _ in $(seq 1 {limit}); do
    flow -w "$ws" serve --workers 1 --lease 1s --kill-grace 1s &
    pid=$!
    # the manager's walltime: TERM once its fresh attempt of `main` sleeps (at most 10 s)
    for _ in $(seq 1 100); do
        [ -e "$ws/asleep" ] && break
        sleep 0.1
    done
    rm -f "$ws/asleep"
    kill -TERM "$pid"
    wait "$pid"
    [ -n "$(flow -w "$ws" list --state succeeded --json | grep '"key"')" ] && exit 0
done
exit 1
"""


def test_a_job_drained_150_times_keeps_its_whole_retries_budget(
    root: str, scripts: Path, cluster: Cluster, tmp_path: Path
) -> None:
    [jid] = submit(root, write_script(scripts, "ckpt.sh", CHECKPOINTER), retries=1)
    batch = tmp_path / "managers.sh"
    batch.write_text(MANAGERS.format(limit=DRAINS * 2 + 20))
    out = tmp_path / "managers.out"
    argv = ["sbatch", "--parsable", "--time=15", "--cpus-per-task=1", f"--output={out}"]
    p = run(*argv, f"--chdir={root}", str(batch), root, env=flow_env())
    assert p.returncode == 0, p.stderr
    job_id = p.stdout.strip().split(";")[0]
    started = time.monotonic()
    wait_for(lambda: job(root, jid).state.is_terminal, 840, 1.0)
    info = job(root, jid)
    assert info.state is State.SUCCEEDED, (out.read_text()[-3000:], dump(root, [jid]))
    assert info.last["message"] == f"after {DRAINS} drains"
    drains = [a for a in info.attempts if a.get("result", {}).get("interrupted") == "drain"]
    assert len(drains) >= DRAINS
    # the one charged failure is the only retry it used, in an activation of its own
    charged = [
        f
        for f in info.frames
        if f.get("to") == "committing" and str(f.get("why", "")).startswith("process failure")
    ]
    assert len(charged) == 1, dump(root, [jid])
    assert cluster.wait_ended(job_id, 60) == "COMPLETED", out.read_text()[-3000:]
    print(
        f"\n{len(drains)} drains, {len(info.attempts)} attempts, "
        f"{time.monotonic() - started:.0f} s in Slurm job {job_id}"
    )
