"""A manager that knows when its time ends: no job starts that cannot finish, and it
drains when the time comes."""

from __future__ import annotations

import time
from pathlib import Path

from httk_flow.protocol.states import State

from .support import Managers, committed, dump, job, submit, write_script

#: the first attempt sleeps until stopped; any later attempt succeeds at once
SLEEPER = """
if [ "$(bump main)" -eq 1 ]; then
    sleep 30
fi
publish '{"action":"succeed"}'
"""


def test_a_job_whose_time_does_not_fit_the_walltime_is_not_started(
    root: str, scripts: Path, managers: Managers
) -> None:
    program = write_script(scripts, "ok.sh", "exit 0\n")
    [long] = submit(root, program, time=3600.0)
    [short] = submit(root, program, time=1.0)
    # it stops with work left that it could not do: exit 4 (docs/cli.md)
    assert managers.run(root, "--walltime", "60s") == 4
    assert job(root, long).state is State.READY, dump(root)
    assert job(root, long).attempts == []
    assert job(root, short).state is State.SUCCEEDED, dump(root)
    assert managers.run(root) == 0
    assert job(root, long).state is State.SUCCEEDED, dump(root)


def test_reaching_the_walltime_drains_the_manager(
    root: str, scripts: Path, managers: Managers
) -> None:
    [jid] = submit(root, write_script(scripts, "sleeper.sh", SLEEPER))
    t0 = time.monotonic()
    assert managers.run(root, "--walltime", "2s") == 0
    assert time.monotonic() - t0 < 10
    info = job(root, jid)
    assert info.state is State.READY, dump(root)
    assert info.last["why"] == "interrupted"
    assert managers.run(root) == 0
    assert [why for _, _, why in committed(job(root, jid))] == ["interrupted", "succeed"]
