"""Launching ahead (httk_flow/manager/ahead.py): while every worker runs a short attempt,
the next jobs wait claimed behind their closed gates. Real managers, real launchers, real
signals: a job launched ahead runs once, when a worker frees, on that worker's CPU; one
that waits too long, is cancelled, or whose manager drains or dies never runs there."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from helpers import processes_with_env, wait_for

from httk_flow.manager.ahead import MAX_WAIT, SHORT, LaunchAhead
from httk_flow.protocol.states import State

from .support import (
    ManagerProcess,
    Managers,
    attempt_dirs,
    committed,
    dump,
    flow,
    job,
    leased_workspace,
    log_of,
    submit,
    write_program,
)

#: notes its job id, CPU count and CPU list, then holds its worker until `release` exists
BLOCK = """#!/bin/{shell}
echo "$FLOW_JOB_ID $FLOW_CPUS $FLOW_CPU_LIST" >> {d}/ran
touch {d}/started.$FLOW_JOB_ID
while [ ! -e {d}/release ]; do sleep 0.02; done
"""


class Scene:
    """Four quick jobs make the manager's attempts short; then four blocking ones: two
    run, two wait launched ahead."""

    def __init__(self, root: str, tmp: Path, managers: Managers, shell: str = "sh") -> None:
        self.root = root
        self.d = tmp / "shared"
        self.d.mkdir()
        quick = write_program(tmp, "quick", f'#!/bin/{shell}\necho "$FLOW_JOB_ID" >> {self.d}/q\n')
        block = write_program(tmp, "block", BLOCK.format(shell=shell, d=self.d))
        submit(root, quick, 4)
        self.p: ManagerProcess = managers.start(root, command="serve", workers=2)
        wait_for(lambda: self._lines("q") == 4 or self.p.poll() is not None, 30)
        wait_for(lambda: all(job(root, i).state is State.SUCCEEDED for i in self._quick()), 30)
        self.ids = submit(root, block, 4)
        wait_for(lambda: len(self.started()) == 2 and len(self.claimed()) == 2, 30)
        time.sleep(0.3)  # a gate opened by mistake would show by now
        assert len(self.started()) == 2, dump(root)
        self.running = sorted(self.started())
        self.ahead = sorted(set(self.ids) - set(self.running))
        assert sorted(self.claimed()) == self.ahead, dump(root)

    def _lines(self, name: str) -> int:
        path = self.d / name
        return len(path.read_text().splitlines()) if path.exists() else 0

    def _quick(self) -> list[str]:
        return (self.d / "q").read_text().split()

    def started(self) -> list[str]:
        return [p.name.split(".", 1)[1] for p in self.d.glob("started.*")]

    def claimed(self) -> list[str]:
        return [i for i in self.ids if job(self.root, i).state is State.CLAIMED]

    def ran(self) -> list[list[str]]:
        return [line.split() for line in (self.d / "ran").read_text().splitlines()]

    def release(self) -> None:
        (self.d / "release").touch()

    def stop(self) -> None:
        """Drain the manager, which must exit cleanly."""
        self.p.send_signal(signal.SIGTERM)
        assert self.p.wait(20) == 0, log_of(self.p)

    def all_in(self, ids: list[str], state: State, timeout: float = 30.0) -> None:
        wait_for(lambda: all(job(self.root, i).state is state for i in ids), timeout)
        assert all(job(self.root, i).state is state for i in ids), dump(self.root)


def _launcher_of(jid: str) -> list[int]:
    """Processes whose environment names the job (its launcher, waiting at the gate)."""
    return processes_with_env(f"FLOW_JOB_ID={jid}")


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_jobs_launched_ahead_wait_at_their_gates_then_each_runs_once_on_a_freed_cpu(
    root: str, tmp_path: Path, managers: Managers, shell: str
) -> None:
    s = Scene(root, tmp_path, managers, shell)
    # launched: each has a launcher process blocked at its gate (its program has not run)
    for jid in s.ahead:
        assert _launcher_of(jid), dump(root)
    first = {jid: cpus for jid, _, cpus in s.ran()}
    s.release()
    s.all_in(s.ids, State.SUCCEEDED)
    ran = s.ran()
    assert sorted(jid for jid, _, _ in ran) == sorted(s.ids)  # each ran once
    assert {n for _, n, _ in ran} == {"1"}
    # the CPU named at the gate is one of the two the workers hold, as it is for the
    # jobs started the usual way
    workers_cpus = set(first.values())
    assert len(workers_cpus) == 2
    assert {cpus for jid, _, cpus in ran if jid in s.ahead} <= workers_cpus
    for jid in s.ids:
        info = job(root, jid)
        assert [why for _, _, why in committed(info)] == ["exit_0"], dump(root)
        assert attempt_dirs(info.job_dir(root)) == []  # printed nothing: tidied
    s.stop()


def test_a_job_launched_ahead_that_waits_too_long_goes_back_to_ready_uncharged(
    root: str, tmp_path: Path, managers: Managers
) -> None:
    s = Scene(root, tmp_path, managers)
    s.all_in(s.ahead, State.READY, timeout=MAX_WAIT + 20)
    for jid in s.ahead:
        info = job(root, jid)
        assert str(info.last["why"]).startswith("released: launched ahead"), dump(root)
        assert info.last["try"] == 0
        assert attempt_dirs(info.job_dir(root)) == []  # what its launcher made is gone
        assert not _launcher_of(jid)
    # the attempts under way are long now: nothing is launched ahead again
    time.sleep(1.5)
    assert {job(root, i).state for i in s.ahead} == {State.READY}, dump(root)
    s.release()
    s.all_in(s.ids, State.SUCCEEDED)
    assert sorted(jid for jid, _, _ in s.ran()) == sorted(s.ids)
    for jid in s.ahead:
        assert [why for _, _, why in committed(job(root, jid))] == ["exit_0"]
    s.stop()


def test_a_job_cancelled_while_launched_ahead_never_runs(
    root: str, tmp_path: Path, managers: Managers
) -> None:
    s = Scene(root, tmp_path, managers)
    gone = s.ahead[0]
    r = flow("-w", root, "cancel", gone)
    assert r.returncode == 0, r.stderr
    assert job(root, gone).state is State.CANCELLED
    s.release()
    s.all_in([i for i in s.ids if i != gone], State.SUCCEEDED)
    wait_for(lambda: not _launcher_of(gone), 10)
    assert not _launcher_of(gone)
    assert gone not in {jid for jid, _, _ in s.ran()}
    info = job(root, gone)
    assert info.state is State.CANCELLED
    assert attempt_dirs(info.job_dir(root)) == []
    s.stop()


def test_a_drain_gives_back_the_jobs_launched_ahead(
    root: str, tmp_path: Path, managers: Managers
) -> None:
    s = Scene(root, tmp_path, managers)
    s.p.send_signal(signal.SIGTERM)
    assert s.p.wait(30) == 0, log_of(s.p)
    for jid in s.ids:
        info = job(root, jid)
        assert info.state is State.READY, dump(root)
        assert info.last["try"] == 0
        assert not _launcher_of(jid)
    s.release()
    assert managers.run(root) == 0
    s.all_in(s.ids, State.SUCCEEDED)
    ran = [jid for jid, _, _ in s.ran()]
    for jid in s.ahead:
        assert ran.count(jid) == 1  # never started by the drained manager
    for jid in s.running:
        assert ran.count(jid) == 2  # interrupted by the drain, then run again


def test_jobs_launched_ahead_by_a_killed_manager_run_once_elsewhere(
    tmp_path: Path, managers: Managers
) -> None:
    root = leased_workspace(tmp_path / "ws", "1s")
    s = Scene(root, tmp_path, managers)
    s.p.kill()
    s.p.wait()
    # the gate's pipe closed with the manager: each launcher ends without its program
    wait_for(lambda: not any(_launcher_of(j) for j in s.ahead), 10)
    assert not any(_launcher_of(j) for j in s.ahead)
    s.release()
    assert managers.run(root) == 0
    s.all_in(s.ids, State.SUCCEEDED)
    ran = [jid for jid, _, _ in s.ran()]
    for jid in s.ahead:
        assert ran.count(jid) == 1, dump(root)
        frames = job(root, jid).frames
        assert any(f.get("why") == "released: owner gone" for f in frames), dump(root)


# -- the policy ---------------------------------------------------------------------------


def test_nothing_is_launched_ahead_until_the_last_attempts_were_short() -> None:
    a = LaunchAhead(2)
    assert a.room(2) == 0
    a.ended(0.01)
    assert a.room(2) == 0
    a.ended(0.01)
    assert a.room(2) == 2
    assert a.room(1) == 0  # a free worker takes a job the usual way
    a.ended(SHORT + 0.1)
    assert a.room(2) == 0


def test_a_continuation_depth_first_stops_launching_ahead_and_breadth_first_does_not() -> None:
    depth, breadth = LaunchAhead(1), LaunchAhead(1, depth_first=False)
    for a in (depth, breadth):
        a.ended(0.01, continues=True)
    assert depth.room(1) == 0
    assert breadth.room(1) == 1


def test_a_disabled_launch_ahead_never_has_room() -> None:
    a = LaunchAhead(1, enabled=False)
    for _ in range(5):
        a.ended(0.01)
    assert a.room(1) == 0


def test_no_launch_ahead_claims_only_for_a_free_worker(
    root: str, tmp_path: Path, managers: Managers
) -> None:
    d = tmp_path / "shared"
    d.mkdir()
    quick = write_program(tmp_path, "quick", "#!/bin/sh\n")
    block = write_program(tmp_path, "block", BLOCK.format(shell="sh", d=d))
    submit(root, quick, 4)
    p = managers.start(root, "--no-launch-ahead", command="serve", workers=2)
    ids = submit(root, block, 4)
    wait_for(lambda: len(list(d.glob("started.*"))) == 2 or p.poll() is not None, 30)
    time.sleep(1.5)
    states = sorted(job(root, i).state.value for i in ids)
    assert states == ["ready", "ready", "running", "running"], dump(root)
    (d / "release").touch()
    wait_for(lambda: all(job(root, i).state is State.SUCCEEDED for i in ids), 30)
    p.send_signal(signal.SIGTERM)
    assert p.wait(20) == 0, log_of(p)
