"""An idle manager ticks less often: every tick walks each state's directories, and a
fleet of idle managers on a shared filesystem pays for all of them. New work still
reaches it within the longest idle sleep."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers import wait_for

from httk_flow.manager.config import ManagerConfig
from httk_flow.manager.loop import Manager
from httk_flow.manager.pace import IDLE_SLEEP, IDLE_TICKS, IdlePace
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace
from manager.support import Managers, job, submit, write_script


def test_the_sleep_doubles_after_idle_ticks_up_to_its_cap_and_work_resets_it() -> None:
    pace = IdlePace(poll_interval=0.5, lease=30)
    paces = [pace.after(idle=True) for _ in range(IDLE_TICKS + 4)]
    assert paces == [0.5] * IDLE_TICKS + [1.0, 2.0, IDLE_SLEEP, IDLE_SLEEP]
    assert pace.after(idle=False) == 0.5  # something was done: awake again
    assert pace.after(idle=True) == 0.5


def test_a_short_lease_caps_the_idle_sleep_so_heartbeats_stay_fresh() -> None:
    pace = IdlePace(poll_interval=0.25, lease=2)
    assert max(pace.after(idle=True) for _ in range(IDLE_TICKS + 6)) == 0.5  # lease / 4


def test_a_poll_interval_longer_than_the_idle_sleep_is_kept() -> None:
    pace = IdlePace(poll_interval=5.0, lease=60)
    assert {pace.after(idle=True) for _ in range(IDLE_TICKS + 3)} == {5.0}


def test_a_manager_paces_with_its_own_poll_interval_and_lease(tmp_path: Path) -> None:
    ws = Workspace.create(str(tmp_path / "ws"))
    try:
        m = Manager(ws, ManagerConfig(workers=2, verbose=False, poll_interval=0.25, lease=2))
        assert (m.pace.poll_interval, m.pace.longest) == (0.25, 0.5)
    finally:
        ws.close()


def _voluntary_switches(pid: int) -> int:
    # each sleep of the loop is one voluntary context switch of its only thread
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc")


@pytest.mark.slow
def test_an_idle_serve_sleeps_longer_yet_takes_new_work_within_the_idle_sleep(
    tmp_path: Path, managers: Managers
) -> None:
    root = str(Workspace.create(str(tmp_path / "ws")).root)
    p = managers.start(root, command="serve")
    # past the idle ticks at the default poll interval (0.5 s) and two doublings
    time.sleep(IDLE_TICKS * 0.5 + 3.0)
    before = _voluntary_switches(p.pid)
    time.sleep(4.0)
    ticks = _voluntary_switches(p.pid) - before
    # at the poll interval it would be 8 sleeps; at 2 s, 2 (one more for slack)
    assert ticks <= 3, ticks
    done = tmp_path / "done"
    program = write_script(tmp_path / "scripts", "touch.sh", f"touch '{done}'\nexit 0\n")
    t0 = time.monotonic()
    [jid] = submit(root, program)
    wait_for(lambda: job(root, jid).state is State.SUCCEEDED, timeout=IDLE_SLEEP + 10)
    assert time.monotonic() - t0 < IDLE_SLEEP + 5
    assert done.exists()
