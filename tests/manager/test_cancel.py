"""Cancelling a running job: fenced by the CLI, stopped by its manager, or by another
manager when its own is gone; cancelled only once the process is known to be gone."""

from __future__ import annotations

from pathlib import Path

from helpers import wait_for

from httk_flow.protocol.states import State

from .support import (
    ManagerProcess,
    Managers,
    dump,
    flow,
    job,
    log_of,
    processes_of,
    submit,
    write_script,
)

SLEEPER = """
touch "$FLOW_WORKDIR/started"
sleep 30
publish '{"action":"succeed"}'
"""


def serve_until_started(root: str, scripts: Path, managers: Managers) -> tuple[str, ManagerProcess]:
    [jid] = submit(root, write_script(scripts, "sleeper.sh", SLEEPER))
    p = managers.start(root, command="serve")
    started = job(root, jid).job_dir(root) / "run" / "started"
    wait_for(lambda: started.exists() or p.poll() is not None, 20)
    assert p.poll() is None, log_of(p)
    return jid, p


def test_a_cancelled_running_job_is_stopped_by_its_manager(
    root: str, scripts: Path, managers: Managers
) -> None:
    jid, p = serve_until_started(root, scripts, managers)
    result = flow("-w", root, "cancel", jid, "--reason", "enough")
    assert result.returncode == 0, result.stderr
    wait_for(lambda: job(root, jid).state is State.CANCELLED, 15)
    assert not processes_of(root)
    info = job(root, jid)
    assert info.last["evidence"]["verified"] == "reaped by its manager"
    assert [f["to"] for f in info.frames[-2:]] == ["cancelling", "cancelled"]
    assert info.frames[-2]["reason"] == "enough"
    assert p.poll() is None, "the manager serves on after a cancellation"
    p.terminate()
    assert p.wait(10) == 0, log_of(p)


def test_a_cancelled_job_of_a_killed_manager_is_cancelled_by_another(
    root: str, scripts: Path, managers: Managers
) -> None:
    jid, p = serve_until_started(root, scripts, managers)
    owner = job(root, jid).last["attempt"]["manager"]
    p.kill()
    p.wait()
    assert flow("-w", root, "cancel", jid).returncode == 0
    assert job(root, jid).state is State.CANCELLING
    assert managers.run(root) == 0
    info = job(root, jid)
    assert info.state is State.CANCELLED, dump(root)
    assert info.last["evidence"]["owner"] == owner
    assert info.last["evidence"]["evidence"] == "process_gone"
    assert not processes_of(root), "the orphaned attempt was stopped before the cancel"
