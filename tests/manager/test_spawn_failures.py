"""A node whose spawns keep failing stops claiming, rather than failing the workspace.

The failures are real: the jobs' `#!` names a "bash" that is an empty executable file, so
the kernel refuses to execute it (ENOEXEC) inside the manager's posix_spawn, as it would
refuse a bash built for another machine or one half-copied onto a node.
"""

from __future__ import annotations

from pathlib import Path

from helpers import wait_for

from httk_flow.manager.local import SPAWN_FAILURES
from httk_flow.protocol.states import State

from .support import (
    Managers,
    all_jobs,
    job,
    log_of,
    submit,
    whole_log,
    write_program,
    write_script,
)


def broken_bash_jobs(root: str, scripts: Path, count: int) -> list[str]:
    bash = scripts / "bin" / "bash"
    bash.parent.mkdir(parents=True)
    bash.write_bytes(b"")
    bash.chmod(0o755)
    return submit(root, write_program(scripts, "job.sh", f"#!{bash}\nexit 0\n"), count=count)


def states(root: str) -> dict[State, int]:
    counts: dict[State, int] = {}
    for info in all_jobs(root):
        counts[info.state] = counts.get(info.state, 0) + 1
    return counts


def test_a_node_that_cannot_spawn_fails_a_few_jobs_and_stops_claiming(
    root: str, scripts: Path, managers: Managers
) -> None:
    ids = broken_bash_jobs(root, scripts, 4 * SPAWN_FAILURES)
    p = managers.start(root, quiet=True)
    assert p.wait(60) == 1, log_of(p)
    log = whole_log(p)
    assert states(root) == {State.FAILED: SPAWN_FAILURES, State.READY: 3 * SPAWN_FAILURES}, log
    assert (
        f"problem: cannot start attempts on this node: {SPAWN_FAILURES} spawns in a row "
        "failed, the last with Exec format error: " in log
    ), log
    bash = scripts / "bin" / "bash"
    assert f"Exec format error: {bash}, the bash that the program's #! line names" in log
    assert "`flow resume` the jobs it failed: launch_error in `flow list --state failed`)" in log
    assert "Traceback" not in log
    failed = [job(root, i) for i in ids if job(root, i).state is State.FAILED]
    assert {info.failure_code for info in failed} == {"launch_error"}


def test_attempts_already_running_run_on_when_the_claims_stop(
    root: str, scripts: Path, managers: Managers
) -> None:
    """The halt is not a drain: what runs was started well, and is not interrupted."""
    [slow] = submit(
        root,
        write_script(scripts, "slow.sh", 'sleep 2\ntouch "$FLOW_WORKDIR/done"\n'),
        priority=900,
    )
    broken_bash_jobs(root, scripts, 2 * SPAWN_FAILURES)
    p = managers.start(root, workers=2, quiet=False)
    assert p.wait(60) == 1, log_of(p)
    log = whole_log(p)
    assert job(root, slow).state is State.SUCCEEDED, log
    assert (job(root, slow).job_dir(root) / "run" / "done").exists()
    assert "draining (spawns fail): no new claims; 1 attempt(s) run on" in log
    assert states(root) == {
        State.SUCCEEDED: 1,
        State.FAILED: SPAWN_FAILURES,
        State.READY: SPAWN_FAILURES,
    }, log


def test_a_job_that_starts_breaks_the_run_of_failures(
    root: str, scripts: Path, managers: Managers
) -> None:
    """Failures with starts between them are the jobs', and every one is failed."""
    bash = scripts / "bin" / "bash"
    bash.parent.mkdir(parents=True)
    bash.write_bytes(b"")
    bash.chmod(0o755)
    bad = write_program(scripts, "bad.sh", f"#!{bash}\nexit 0\n")
    good = write_script(scripts, "good.sh", "exit 0\n")
    # alternating by priority: each failed spawn is followed by a good start
    for i in range(2 * SPAWN_FAILURES):
        submit(root, bad if i % 2 == 0 else good, priority=800 - i)
    p = managers.start(root, workers=1, quiet=True)
    assert p.wait(60) == 1, log_of(p)
    assert states(root) == {State.FAILED: SPAWN_FAILURES, State.SUCCEEDED: SPAWN_FAILURES}
    assert "cannot start attempts" not in whole_log(p)


def test_the_walltime_still_stops_what_runs_after_the_claims_stopped(
    root: str, scripts: Path, managers: Managers
) -> None:
    """A drain that lets attempts run on is made a stopping one by a signal."""
    [slow] = submit(
        root, write_script(scripts, "slow.sh", 'touch "$FLOW_WORKDIR/up"\nsleep 60\n'), priority=900
    )
    broken_bash_jobs(root, scripts, SPAWN_FAILURES + 1)
    p = managers.start(root, command="serve", workers=2, quiet=False)
    wait_for(lambda: "1 attempt(s) run on" in whole_log(p) or p.poll() is not None, 30)
    assert p.poll() is None, log_of(p)
    p.terminate()
    assert p.wait(30) == 1, log_of(p)
    log = whole_log(p)
    assert "draining (signal SIGTERM): no new claims; stopping 1 attempt(s)" in log, log
    assert job(root, slow).state is State.READY, log  # interrupted by the drain, not failed


def test_arguments_too_large_for_the_kernel_fail_their_jobs_only(
    root: str, scripts: Path, managers: Managers
) -> None:
    """E2BIG is the job's own (an argument over the kernel's 128 KiB): each such job is
    failed with words its author can act on, and the node keeps claiming."""
    big = submit(root, "/bin/true", count=2 * SPAWN_FAILURES, args=["y" * 200_000], priority=900)
    ok = submit(root, write_script(scripts, "ok.sh", "exit 0\n"), count=2)
    p = managers.start(root, quiet=True)
    assert p.wait(60) == 1, log_of(p)
    log = whole_log(p)
    assert "cannot start attempts on this node" not in log, log
    assert states(root) == {State.FAILED: 2 * SPAWN_FAILURES, State.SUCCEEDED: 2}, log
    for ident in big:
        failure = job(root, ident).last["failure"]
        assert failure["code"] == "launch_error"
        assert "larger than the kernel takes" in failure["message"], failure
    assert all(job(root, i).state is State.SUCCEEDED for i in ok)
