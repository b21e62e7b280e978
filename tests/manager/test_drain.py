"""`flow serve` and signals: the first SIGTERM drains, a later second one exits at once,
and two within the repeat window count as one. Real processes, real signals."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

from helpers import wait_for

from httk_flow.manager.drain import REPEAT_SIGNAL_WINDOW
from httk_flow.protocol.states import State

from .support import (
    ManagerProcess,
    Managers,
    committed,
    dump,
    job,
    log_of,
    processes_of,
    wait_beats,
)

#: the first attempt survives SIGTERM (noting it) and waits for a release file
STUBBORN = """
if [ "$(bump main)" -eq 1 ]; then
    trap 'touch "$FLOW_WORKDIR/got-term"' TERM
    touch "$FLOW_WORKDIR/started"
    while [ ! -e "$FLOW_WORKDIR/release" ]; do sleep 0.05; done
    exit 0
fi
publish '{"action":"succeed"}'
"""


#: the fixture serve_one_job (tests/manager/conftest.py): one job served until its first
#: attempt has started, by default an attempt that sleeps until it is stopped (a later one
#: notes its restart flags in $FLOW_WORKDIR/restart)
Serve = Callable[..., tuple[str, Path, ManagerProcess]]


def assert_finished_after_the_interruption(root: str, managers: Managers, jid: str) -> None:
    """A later manager runs the job to success: committed once interrupted, then succeeded."""
    assert managers.run(root) == 0
    info = job(root, jid)
    assert info.state is State.SUCCEEDED, dump(root)
    assert [why for _, _, why in committed(info)] == ["interrupted", "succeed"]


def test_sigterm_drains_a_running_job_back_to_ready_without_charging_it(
    root: str, managers: Managers, serve_one_job: Serve
) -> None:
    jid, _, p = serve_one_job()
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 0, log_of(p)
    assert time.monotonic() - t0 < 5

    info = job(root, jid)
    assert info.state is State.READY, dump(root)
    assert info.last["why"] == "interrupted"
    assert info.last["try"] == 0  # the failure budget of the activation is intact
    assert info.last["result"]["interrupted"] == "drain"
    assert info.last.get("not_before") is None and info.handle.marker.not_before == 0

    assert_finished_after_the_interruption(root, managers, jid)


def test_the_attempt_after_a_drain_is_an_unclean_restart(
    root: str, managers: Managers, serve_one_job: Serve
) -> None:
    jid, workdir, p = serve_one_job()
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 0, log_of(p)
    assert managers.run(root) == 0
    assert job(root, jid).state is State.SUCCEEDED
    assert (workdir / "restart").read_text().split() == ["1", "1"]


def test_a_second_sigterm_after_the_repeat_window_exits_at_once(
    root: str, managers: Managers, serve_one_job: Serve
) -> None:
    jid, workdir, p = serve_one_job("--kill-grace", "60s", body=STUBBORN)
    p.send_signal(signal.SIGTERM)
    wait_for(lambda: (workdir / "got-term").exists(), 10)
    # the manager took the first signal before it passed TERM on to its attempt, so the
    # window is counted from no later than now, however late the signal was delivered
    handled = time.monotonic()
    assert p.poll() is None, "the manager must wait for its attempt while draining"
    # the spacing itself is under test (the scene): a repeat inside the window is ignored
    time.sleep(REPEAT_SIGNAL_WINDOW + 0.2)
    second = time.monotonic()
    assert second - handled > REPEAT_SIGNAL_WINDOW
    p.send_signal(signal.SIGTERM)
    p.wait(10)
    assert time.monotonic() - second < 4, log_of(p)
    wait_for(lambda: not processes_of(root), 10)  # its attempt was killed with it

    info = job(root, jid)
    assert info.state is State.RUNNING, dump(root)  # left for a lease takeover
    (workdir / "release").touch()
    assert_finished_after_the_interruption(root, managers, jid)


def test_two_sigterms_within_milliseconds_count_as_one(
    root: str, managers: Managers, serve_one_job: Serve
) -> None:
    jid, workdir, p = serve_one_job("--kill-grace", "60s", "--lease", "1s", body=STUBBORN)
    p.send_signal(signal.SIGTERM)
    p.send_signal(signal.SIGTERM)
    wait_for(lambda: (workdir / "got-term").exists(), 10)
    # both signals were sent before the manager took the first; had the second one counted,
    # it would have stopped at once. It goes on instead: its loop heartbeats six more times
    # (5 thirds of its 1 s lease) and it is still there, draining
    wait_beats(root, p, 6)
    (workdir / "release").touch()
    assert p.wait(10) == 0, log_of(p)  # the drain finished: the attempt ended by itself
    info = job(root, jid)
    assert info.state is State.READY, dump(root)
    assert info.last["why"] == "interrupted"


def test_a_manager_killed_while_signalling_its_attempts_leaves_work_that_converges(
    root: str, managers: Managers, serve_one_job: Serve
) -> None:
    jid, _, p = serve_one_job(env={"FLOW_CRASH_AT": "cancel.after_signal"})
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == -signal.SIGKILL, log_of(p)
    assert_finished_after_the_interruption(root, managers, jid)


def test_an_attempt_that_ignores_sigterm_is_killed_after_the_grace_and_not_charged(
    root: str, managers: Managers, serve_one_job: Serve
) -> None:
    jid, workdir, p = serve_one_job("--kill-grace", "0.5s", body=STUBBORN)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 0, log_of(p)
    assert time.monotonic() - t0 < 5
    assert (workdir / "got-term").exists()
    info = job(root, jid)
    assert info.state is State.READY, dump(root)
    assert info.last["why"] == "interrupted"
    assert info.last["result"]["signal"] == signal.SIGKILL
    assert info.last["try"] == 0
