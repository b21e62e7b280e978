"""Work of a SIGKILLed manager is taken over by another manager on the same host, on evidence."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import proc, wait_for

from httk_flow.manager.launcher import group_alive, proc_start_time, process_alive
from httk_flow.protocol.states import State

from .support import (
    JobInfo,
    ManagerProcess,
    Managers,
    beats,
    committed,
    dump,
    job,
    log_of,
    manager_up,
    processes_of,
    submit,
    wait_beats,
    whole_log,
    write_script,
)

#: step main waits for a `go` file, then advances; step two succeeds
WAITS_FOR_GO = """
case "$FLOW_STEP" in
    main)
        bump main > /dev/null
        touch "$FLOW_WORKDIR/started"
        while [ ! -e "$FLOW_WORKDIR/go" ]; do sleep 0.05; done
        publish '{"action":"advance","step":"two"}'
        ;;
    two) publish '{"action":"succeed"}' ;;
esac
"""


#: the fixture serve_one_job (tests/manager/conftest.py): one job served until its first
#: attempt has started, by default an attempt that sleeps until it is stopped
Serve = Callable[..., tuple[str, Path, ManagerProcess]]


def orphaned_attempt(
    root: str, serve_one_job: Serve, body: str | None = None
) -> tuple[str, Path, str]:
    """A job whose manager was SIGKILLed while its first attempt (the sleeper of
    serve_one_job unless `body` is given) runs on: (id, workdir, owner)."""
    jid, workdir, first = serve_one_job(body=body)
    owner = job(root, jid).last["attempt"]["manager"]
    first.kill()
    first.wait()
    assert job(root, jid).state is State.RUNNING
    assert processes_of(root), "the attempt outlives its manager"
    return jid, workdir, owner


@pytest.fixture
def taken_over(root: str, managers: Managers, serve_one_job: Serve) -> tuple[JobInfo, str]:
    """The running job of a SIGKILLed manager once another manager has run to idle: the
    job, and the id of its dead owner."""
    jid, _, owner = orphaned_attempt(root, serve_one_job)
    assert managers.run(root) == 0
    return job(root, jid), owner


def test_a_killed_managers_running_job_is_recovered_by_another_manager(
    root: str, taken_over: tuple[JobInfo, str]
) -> None:
    info, owner = taken_over
    assert info.state is State.SUCCEEDED, dump(root)
    assert [why for _, _, why in committed(info)] == ["interrupted", "succeed"]
    takeover = next(f for f in info.frames if f.get("to") == "committing")
    assert takeover["by"] != owner
    assert takeover["attempt"]["manager"] == owner
    assert takeover["result"]["interrupted"] == "takeover"
    assert info.frames[-1]["by"] != owner
    assert not processes_of(root), "the orphaned attempt was stopped before the takeover"


def test_a_running_takeover_records_process_gone_evidence_in_its_frame(
    root: str, taken_over: tuple[JobInfo, str]
) -> None:
    info, owner = taken_over
    evidence = [f["evidence"] for f in info.frames if "evidence" in f]
    assert evidence, dump(root)
    assert evidence[0]["owner"] == owner
    assert evidence[0]["evidence"] == "process_gone"


def test_an_outcome_published_while_its_manager_was_dead_is_committed_not_rerun(
    root: str, managers: Managers, serve_one_job: Serve
) -> None:
    jid, workdir, _ = orphaned_attempt(root, serve_one_job, WAITS_FOR_GO)
    (workdir / "go").touch()
    wait_for(lambda: not processes_of(root), 10)
    assert managers.run(root) == 0
    info = job(root, jid)
    assert info.state is State.SUCCEEDED, dump(root)
    assert committed(info) == [(1, "main", "advance"), (2, "two", "succeed")]
    assert (workdir / "main.count").read_text().strip() == "1"


def test_a_job_a_takeover_commits_failed_is_in_the_summary_and_the_exit_status(
    root: str, managers: Managers, serve_one_job: Serve
) -> None:
    """The manager that commits a dead one's attempt failed says so in its summary, as it
    does for its own attempts: its exit status 1 needs the line that explains it."""
    fails = WAITS_FOR_GO.replace('{"action":"advance","step":"two"}', '{"action":"fail"}')
    jid, workdir, _ = orphaned_attempt(root, serve_one_job, fails)
    (workdir / "go").touch()
    wait_for(lambda: not processes_of(root), 10)
    p = managers.start(root, command="run", quiet=True)
    assert p.wait(60) == 1, log_of(p)
    assert "stopped: 0 succeeded, 1 failed" in whole_log(p), whole_log(p)
    assert job(root, jid).state is State.FAILED


def test_a_claim_of_a_killed_manager_is_released_with_its_evidence(
    root: str, scripts: Path, managers: Managers
) -> None:
    [jid] = submit(root, write_script(scripts, "ok.sh", """publish '{"action":"succeed"}'\n"""))
    first = managers.start(root, env={"FLOW_CRASH_AT": "claim.after_claim"})
    assert first.wait(30) == -signal.SIGKILL, log_of(first)
    owner = job(root, jid).last["attempt"]["manager"]
    assert managers.run(root) == 0
    info = job(root, jid)
    assert info.state is State.SUCCEEDED, dump(root)
    released = next(f for f in info.frames if f.get("why") == "released: owner gone")
    assert released["evidence"]["owner"] == owner
    assert released["evidence"]["evidence"] == "process_gone"
    assert released["try"] == 0


@contextlib.contextmanager
def zombie(*, own_group: bool) -> Iterator[subprocess.Popen[bytes]]:
    """A child that has exited but is not reaped yet."""
    p = subprocess.Popen(["true"], process_group=0 if own_group else None)
    try:
        wait_for(lambda: _state(p.pid) == "Z", 10)
        yield p
    finally:
        p.wait()


def _state(pid: int) -> str:
    p = proc(pid)
    assert p is not None, f"process {pid} is gone"
    return p.state


def test_an_exited_but_unreaped_process_is_not_alive() -> None:
    with zombie(own_group=False) as p:
        start = proc_start_time(p.pid)
        assert start is not None
        assert not process_alive(p.pid, start)


def test_a_process_group_of_zombies_is_not_alive() -> None:
    with zombie(own_group=True) as p:
        assert not group_alive(p.pid)


def test_a_live_process_is_alive_and_a_reused_pid_is_not() -> None:
    start = proc_start_time(os.getpid())
    assert start is not None
    assert process_alive(os.getpid(), start)
    assert not process_alive(os.getpid(), start + 1)
    assert group_alive(os.getpgrp())


#: like serve_one_job's sleeper, but counting in the job directory, which isolated attempts
#: share too
SLEEPER_ANYWHERE = """
n=$(cat "$FLOW_JOB_DIR/count" 2>/dev/null || echo 0)
echo $((n + 1)) > "$FLOW_JOB_DIR/count"
if [ "$n" -eq 0 ]; then
    touch "$FLOW_JOB_DIR/started"
    sleep 30
fi
publish '{"action":"succeed"}'
"""


def killed_remote_manager(root: str, scripts: Path, managers: Managers, **fields: Any) -> str:
    """A job whose manager on another host (lease 1 s) was SIGKILLed while it ran."""
    [jid] = submit(root, write_script(scripts, "job.sh", SLEEPER_ANYWHERE), **fields)
    remote = managers.start(root, "--lease", "1s", command="serve", host="elsewhere")
    started = job(root, jid).job_dir(root) / "started"
    wait_for(lambda: started.exists() or remote.poll() is not None, 20)
    assert remote.poll() is None, log_of(remote)
    remote.kill()
    remote.wait()
    assert job(root, jid).last["attempt"]["host"] == "elsewhere"
    return jid


def test_an_isolated_job_of_a_silent_remote_manager_is_taken_over_after_the_lease(
    root: str, scripts: Path, managers: Managers
) -> None:
    jid = killed_remote_manager(root, scripts, managers, workdir="isolated")
    owner = job(root, jid).last["attempt"]["manager"]
    assert managers.run(root, "--lease", "1s") == 0
    info = job(root, jid)
    assert info.state is State.SUCCEEDED, dump(root)
    assert [why for _, _, why in committed(info)] == ["interrupted", "succeed"]
    takeover = next(f for f in info.frames if f.get("to") == "committing")
    assert takeover["by"] != owner
    # lease evidence: silent for longer than the takeover grace (2 x the 1 s lease)
    heartbeat = Path(root) / ".flow" / "managers" / owner / "heartbeat.json"
    assert takeover["t"] >= heartbeat.stat().st_mtime + 2 * 1.0


def test_a_persistent_job_of_a_silent_remote_manager_is_not_taken_over_on_lease_alone(
    root: str, scripts: Path, managers: Managers
) -> None:
    jid = killed_remote_manager(root, scripts, managers)
    local = managers.start(root, "--lease", "1s", command="serve", quiet=False)
    wait_for(lambda: "not taken over on lease age alone" in log_of(local), 20)
    assert job(root, jid).state is State.RUNNING, dump(root)
    local.terminate()
    assert local.wait(10) == 0, log_of(local)
    assert job(root, jid).state is State.RUNNING, dump(root)


def test_a_manager_that_once_looked_silent_is_still_recovered_promptly_when_it_dies(
    root: str, scripts: Path, managers: Managers
) -> None:
    # the watcher serves another pool: it only recovers, it never runs the job itself; the
    # owner is on another host, where a stopped manager looks silent (on this host its live
    # process would keep it alive, stopped or not)
    watcher = managers.start(root, "--lease", "1s", "--pool", "other", command="serve")
    owner = managers.start(root, "--lease", "1s", "--pool", "p", command="serve", host="far")
    manager_up(root, watcher)
    manager_up(root, owner)
    # a stopped owner looks silent; the watcher sweeps, finds no work of it, clears it. No
    # trace is left by a sweep that finds nothing: what is observed is that the watcher ran
    # its passes through 15 heartbeats (14 thirds of its lease, 4.7 s) while the owner was
    # silent, past the 1 s after which it suspects the owner and the sweep that follows
    owner.send_signal(signal.SIGSTOP)
    try:
        silent = beats(root, owner)
        wait_beats(root, watcher, 15)
        assert beats(root, owner) == silent, "the stopped owner heartbeated"
    finally:
        owner.send_signal(signal.SIGCONT)
    # the owner heartbeats again, and the watcher looks (and sees it alive) a few times
    wait_for(lambda: beats(root, owner) > silent, 10)
    wait_beats(root, watcher, 3)

    # isolated: a job on a silent host is taken over on its lease alone
    program = write_script(scripts, "job.sh", SLEEPER_ANYWHERE)
    [jid] = submit(root, program, pool="p", workdir="isolated")
    started = job(root, jid).job_dir(root) / "started"
    wait_for(lambda: started.exists() or owner.poll() is not None, 20)
    assert owner.poll() is None, log_of(owner)
    owner.kill()
    owner.wait()
    # promptly: well before the sweep every SWEEP_EVERY (30 s) would find it anyway
    wait_for(lambda: job(root, jid).state is State.READY, 12)
    assert watcher.poll() is None, log_of(watcher)
    evidence = [f["evidence"] for f in job(root, jid).frames if "evidence" in f]
    assert evidence and {e["evidence"] for e in evidence} == {"lease_expired"}, dump(root)
