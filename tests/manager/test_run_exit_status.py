"""`flow run` exits 1 when a job it ran ended failed, and 0 otherwise."""

from __future__ import annotations

from pathlib import Path

from .support import Managers, flow, job, log_of, submit, whole_log, write_script


def test_flow_run_exits_0_when_every_job_it_ran_succeeded(
    root: str, scripts: Path, managers: Managers
) -> None:
    program = write_script(scripts, "ok.sh", "exit 0\n")
    assert flow("-w", root, "submit", program).returncode == 0
    submit(root, program, count=3)
    assert managers.run(root) == 0


def test_flow_run_exits_1_when_a_job_it_ran_failed(
    root: str, scripts: Path, managers: Managers
) -> None:
    ok = write_script(scripts, "ok.sh", "exit 0\n")
    bad = write_script(scripts, "bad.sh", "exit 7\n")
    submit(root, ok, count=2)
    assert flow("-w", root, "submit", "--retries", "0", bad).returncode == 0
    assert managers.run(root) == 1


def test_flow_run_exits_0_with_nothing_to_do_even_beside_an_old_failure(
    root: str, scripts: Path, managers: Managers
) -> None:
    assert managers.run(root) == 0
    submit(root, write_script(scripts, "bad.sh", "exit 7\n"), retries=0)
    assert managers.run(root) == 1
    assert managers.run(root) == 0  # the failed job is not one this manager ran
    submit(root, write_script(scripts, "ok.sh", "exit 0\n"))
    assert managers.run(root) == 0


def test_a_job_that_cannot_launch_counts_as_failed(
    root: str, scripts: Path, managers: Managers
) -> None:
    """A launch error fails its job like a failed attempt: in the summary and the exit
    status, with no pause before the next claim (it used to be neither, and the manager
    slept its idle pace after each)."""
    ok = submit(root, write_script(scripts, "ok.sh", "exit 0\n"), count=3)
    never = submit(root, write_script(scripts, "never.sh", "exit 0\n"), count=3)
    outside = scripts / "outside"
    outside.mkdir()
    for ident in never:  # a symbolic link where the first attempt's directory goes
        (job(root, ident).job_dir(root) / "a0001").symlink_to(outside)
    p = managers.start(root, command="run", quiet=False)
    assert p.wait(60) == 1, log_of(p)
    log = whole_log(p)
    assert "stopped: 3 succeeded, 3 failed" in log, log
    for ident in never:
        assert job(root, ident).failure_code == "launch_error"
    assert all(job(root, ident).state.value == "succeeded" for ident in ok)
    assert not list(outside.iterdir())


def test_a_job_failed_at_registration_is_said_and_counted(
    root: str, scripts: Path, managers: Managers
) -> None:
    """An invalid job.json fails its job before it can run: said under --quiet, in the
    summary and in the exit status, like a job that ran and failed (it was none)."""
    ok = submit(root, write_script(scripts, "ok.sh", "exit 0\n"), count=2)
    [bad] = submit(root, write_script(scripts, "bad.sh", "exit 0\n"))
    info = job(root, bad)
    (info.job_dir(root) / "job.json").write_text('{"program": ')
    p = managers.start(root, quiet=True)
    assert p.wait(60) == 1, log_of(p)
    log = whole_log(p)
    assert f"problem: {info.handle.key}: failed at registration: " in log, log
    assert "job.json: is not valid JSON" in log, log
    assert "stopped: 2 succeeded, 1 failed" in log, log
    assert job(root, bad).failure_code == "protocol_error"
    assert all(job(root, i).state.value == "succeeded" for i in ok)
