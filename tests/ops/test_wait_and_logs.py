"""`flow wait` exit codes and `flow logs` (stdout, stderr, an earlier attempt, --follow)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from helpers import wait_for
from manager.support import Managers, log_of

from .support import FLOW, SUCCEEDS_AT, Flow, follow, holds, serve_until_started, write_script

#: prints a line, waits for $FLOW_WORKDIR/release, prints another
TWO_LINES = """#!/bin/sh
echo "line 1"
touch "$FLOW_WORKDIR/started"
until [ -e "$FLOW_WORKDIR/release" ]; do sleep 0.05; done
echo "line 2"
"""


def test_wait_exits_0_when_every_job_succeeded(flow: Flow, managers: Managers) -> None:
    flow.submit("--tag", "a", "true")
    flow.submit("--tag", "b", "true")
    assert managers.run(flow.root) == 0
    r = flow("wait")
    assert (r.exit_code, r.output) == (0, "2/2 done: 2 succeeded, 0 failed, 0 cancelled\n")
    r = flow("wait", "a")
    assert (r.exit_code, r.output) == (0, "1/1 done: 1 succeeded, 0 failed, 0 cancelled\n")
    assert flow.json("wait", "b") == {
        "total": 1,
        "done": 1,
        "succeeded": 1,
        "failed": 0,
        "cancelled": 0,
        "timed_out": False,
    }


def test_wait_exits_1_when_some_job_failed(flow: Flow, managers: Managers) -> None:
    flow.submit("--tag", "good", "true")
    flow.submit("--tag", "bad", "--retries", "0", "false")
    assert managers.run(flow.root) == 1
    r = flow("wait")
    assert (r.exit_code, r.output) == (1, "2/2 done: 1 succeeded, 1 failed, 0 cancelled\n")
    assert flow("wait", "good").exit_code == 0
    assert flow("wait", "bad").exit_code == 1


def test_wait_exits_3_when_the_timeout_passes(flow: Flow) -> None:
    flow.submit("--tag", "queued", "true")  # no manager: never runs
    r = flow("wait", "--timeout", "0.3")
    assert (r.exit_code, r.stdout) == (
        3,
        "0/1 done: 0 succeeded, 0 failed, 0 cancelled (timed out)\n",
    )
    # and on stderr, why nothing moved
    assert r.stderr.startswith("flow wait: nothing moves: blocked: 1 job: no live manager")
    assert flow.json("wait", "queued", "--timeout", "0", code=3)["timed_out"] is True


def test_wait_blocks_until_a_running_job_ends(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    two = write_script(scripts, "two.sh", TWO_LINES)
    _, p, run = serve_until_started(flow, managers, "--tag", "slow", two)
    # a wait that watched the running job for a whole second did not return: it timed out
    r = flow("wait", "slow", "--timeout", "1")
    timed_out = "0/1 done: 0 succeeded, 0 failed, 0 cancelled (timed out)\n"
    assert (r.exit_code, r.output) == (3, timed_out)
    waiter = subprocess.Popen(
        [*FLOW, "-w", flow.root, "wait", "slow", "--timeout", "60"],
        stdout=subprocess.PIPE,
        text=True,
    )
    (run / "release").touch()
    out, _ = waiter.communicate(timeout=20)
    assert (waiter.returncode, out) == (0, "1/1 done: 1 succeeded, 0 failed, 0 cancelled\n")
    p.terminate()
    assert p.wait(10) == 0, log_of(p)


def test_logs_print_stdout_stderr_and_an_earlier_attempt(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    job = flow.submit(
        "--tag", "twice", "--param", "ok=2", write_script(scripts, "s.sh", SUCCEEDS_AT)
    )
    assert managers.run(flow.root) == 0
    assert flow.ok("logs", "twice") == "out 2\n"
    assert flow.ok("logs", "twice", "--stderr") == "err 2\n"
    assert flow.ok("logs", "twice", "--attempt", "1") == "out 1\n"
    assert flow.ok("logs", "twice", "--attempt", "1", "--stderr") == "err 1\n"
    r = flow("logs", "twice", "--attempt", "3")
    assert (r.exit_code, r.stderr) == (
        2,
        f"flow: error: job {job['key']}: has no attempt 3 (it has 1-2)\n",
    )


def test_logs_of_a_job_that_never_ran_say_so(flow: Flow) -> None:
    job = flow.submit("--tag", "queued", "true")
    r = flow("logs", "queued")
    assert (r.exit_code, r.stderr) == (
        2,
        f"flow: error: job {job['key']}: has not run yet; see `flow show`\n",
    )


def test_logs_follow_prints_as_the_job_writes_and_ends_with_the_job(
    flow: Flow, scripts: Path, managers: Managers, tmp_path: Path
) -> None:
    two = write_script(scripts, "two.sh", TWO_LINES)
    _, p, run = serve_until_started(flow, managers, "--tag", "talk", two)
    out = tmp_path / "followed"
    f = follow(flow.root, "talk", out)
    try:
        wait_for(lambda: out.read_text() == "line 1\n", 10)
        holds(lambda: f.poll() is None, 0.5)
        (run / "release").touch()
        assert f.wait(20) == 0
    finally:
        if f.poll() is None:
            f.kill()
            f.wait()
    assert out.read_text() == "line 1\nline 2\n"
    assert flow.state("talk") == "succeeded"
    p.terminate()
    assert p.wait(10) == 0, log_of(p)
