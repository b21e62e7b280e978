"""A program that leaves a background process behind (no setsid: it stays in the attempt's
process group). On cancel the whole group is stopped, a TERM-ignoring member included; at
a normal exit what is left in the group gets TERM, then KILL after the kill grace."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from helpers import wait_for
from manager.support import Managers, flow, log_of, submit, write_script

from httk_flow.protocol.procs import group_members_alive, process_alive
from httk_flow.protocol.states import State

from .support import job_now

#: starts a daemon that ignores TERM, records its pid, then exits or keeps running
FORKER = r"""
( trap '' TERM; exec sleep 300 ) &
echo $! > "$FLOW_WORKDIR/daemon.pid"
touch "$FLOW_WORKDIR/started"
if [ "$FLOW_PARAM_then" = run ]; then sleep 300; fi
exit 0
"""


def _daemon(root: str, jid: str) -> int:
    return int((job_now(root, jid).job_dir(root) / "run" / "daemon.pid").read_text())


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def test_cancel_stops_every_member_of_the_attempts_group(
    root: str, scripts: Path, managers: Managers
) -> None:
    prog = write_script(scripts, "forker.sh", FORKER)
    [jid] = submit(root, prog, params={"then": "run"})
    p = managers.start(root, "--kill-grace", "1s", command="serve")
    wait_for(lambda: (job_now(root, jid).job_dir(root) / "run" / "started").exists(), 20)
    daemon = _daemon(root, jid)
    pgid = job_now(root, jid).last["attempt"]["pgid"]
    assert os.getpgid(daemon) == pgid, "the daemon stays in the attempt's group"
    try:
        r = flow("-w", root, "cancel", jid)
        assert r.returncode == 0, r.stderr
        wait_for(lambda: job_now(root, jid).state is State.CANCELLED, 20)
        assert not process_alive(daemon, None), "the TERM-ignoring daemon survived"
        assert not group_members_alive(pgid)
        assert job_now(root, jid).last["evidence"]["group_gone"] is True
        # the manager serves on: a job submitted now still runs
        [later] = submit(root, prog, params={"then": "exit"})
        wait_for(lambda: job_now(root, later).state is State.SUCCEEDED, 20)
        _kill(_daemon(root, later))
        assert p.poll() is None, log_of(p)
    finally:
        _kill(daemon)


def test_what_a_program_leaves_in_its_group_is_stopped_when_it_exits(
    root: str, scripts: Path, managers: Managers
) -> None:
    """At a normal exit the job succeeds at once and `flow run` ends after at most the kill
    grace; the daemon left in the attempt's group (TERM-ignoring) is KILLed, like the end
    of a batch job step."""
    prog = write_script(scripts, "forker.sh", FORKER)
    [jid] = submit(root, prog, params={"then": "exit"})
    started = time.monotonic()
    assert managers.run(root, "--kill-grace", "1s") == 0
    assert time.monotonic() - started < 30, "flow run waited too long for the daemon"
    info = job_now(root, jid)
    daemon = _daemon(root, jid)
    try:
        assert info.state is State.SUCCEEDED
        wait_for(lambda: not process_alive(daemon, None), 10)
        assert not group_members_alive(info.last["attempt"]["pgid"])
    finally:
        _kill(daemon)


def test_a_serving_manager_stops_the_leftovers_after_the_grace_and_serves_on(
    root: str, scripts: Path, managers: Managers
) -> None:
    prog = write_script(scripts, "forker.sh", FORKER)
    p = managers.start(root, "--kill-grace", "1s", command="serve")
    [jid] = submit(root, prog, params={"then": "exit"})
    wait_for(lambda: job_now(root, jid).state is State.SUCCEEDED, 20)
    daemon = _daemon(root, jid)
    try:
        wait_for(lambda: not process_alive(daemon, None), 15)
        [later] = submit(root, "true")
        wait_for(lambda: job_now(root, later).state is State.SUCCEEDED, 20)
        assert p.poll() is None, log_of(p)
    finally:
        _kill(daemon)
