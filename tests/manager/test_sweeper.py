"""The empty directories of a job that ended for good are swept after its final rename,
while the manager would otherwise wait for its attempts (tidy.Sweeper; protocol.md §10,
Tidying): a job that may run again (failed, or back to ready) has them removed before its
final rename, as before. Proved on the Tidy and Sweeper themselves, and on the system
calls of a real `flow run` under strace: what was removed before or after which rename."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from httk_flow.manager.tidy import Sweeper, Tidy

STRACE = shutil.which("strace")


def _attempt(tmp_path: Path, *, printed: bool = False) -> Path:
    """A job directory as an ended attempt leaves it, before its tidy."""
    job = tmp_path / "jobs" / "ab" / "ab01"
    adir = job / "attempts" / "a0001"
    adir.mkdir(parents=True)
    (job / "run").mkdir()
    (job / "job.json").write_text("{}")
    (adir / "context.json").write_text("{}")
    (adir / "stdout").write_text("out\n" if printed else "")
    (adir / "stderr").write_text("")
    (adir / "outcome.line").write_text('{"action":"succeed"}\n')
    return job


def _names(job: Path) -> list[str]:
    return sorted(str(p.relative_to(job)) for p in job.rglob("*"))


def _tidy(job: Path) -> Tidy:
    return Tidy(str(job), "a0001", persistent=True, settled=True)


def _queued(tmp_path: Path, sweeper: Sweeper, n: int) -> list[Path]:
    """n ended jobs, tidied, their directories queued for the sweeper."""
    jobs = []
    for i in range(n):
        job = _attempt(tmp_path / str(i))
        tidy = _tidy(job)
        tidy.run(terminal=True, outcome=True, sweep=True)
        sweeper.put(tidy)
        jobs.append(job)
    return jobs


def test_a_swept_tidy_leaves_the_directories_until_the_sweep(tmp_path: Path) -> None:
    job = _attempt(tmp_path)
    tidy = _tidy(job)
    tidy.run(terminal=True, outcome=True, sweep=True)
    # the files went at once; the directories wait for the sweep
    assert _names(job) == ["attempts", "attempts/a0001", "job.json", "run"]
    tidy.sweep()
    assert _names(job) == ["job.json"]


def test_an_unswept_tidy_removes_the_directories_at_once(tmp_path: Path) -> None:
    job = _attempt(tmp_path, printed=True)
    _tidy(job).run(terminal=True, outcome=True)
    assert _names(job) == ["a0001.stdout", "job.json"]


def test_a_sweep_keeps_what_is_not_empty(tmp_path: Path) -> None:
    job = _attempt(tmp_path)
    tidy = _tidy(job)
    tidy.run(terminal=True, outcome=True, sweep=True)
    (job / "run" / "checkpoint").write_text("kept")
    (job / "attempts" / "a0001" / "exec.failed").write_text("not_found")
    tidy.sweep()
    assert _names(job) == [
        "attempts",
        "attempts/a0001",
        "attempts/a0001/exec.failed",
        "job.json",
        "run",
        "run/checkpoint",
    ]


def test_a_sweep_never_follows_a_symbolic_link(tmp_path: Path) -> None:
    job = _attempt(tmp_path)
    tidy = _tidy(job)
    tidy.run(terminal=True, outcome=True, sweep=True)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "a0001").mkdir(parents=True)
    (elsewhere / "run").mkdir()
    shutil.rmtree(job / "attempts")
    (job / "attempts").symlink_to(elsewhere)
    tidy.sweep()
    assert (elsewhere / "a0001").is_dir()
    assert (job / "attempts").is_symlink()
    assert not (job / "run").exists()  # the job's own run/ is still its own


def test_a_sweep_of_a_vanished_job_is_quiet(tmp_path: Path) -> None:
    job = _attempt(tmp_path)
    tidy = _tidy(job)
    shutil.rmtree(job)
    tidy.sweep()  # no error: a job removed meanwhile has nothing to sweep


def test_the_sweeper_sweeps_until_busy_and_close_sweeps_the_rest(tmp_path: Path) -> None:
    sweeper = Sweeper()
    jobs = _queued(tmp_path, sweeper, 5)
    asked: list[int] = []

    def busy() -> bool:
        asked.append(len(asked))
        return len(asked) > 2  # work came after two jobs were swept

    assert sweeper.sweep(busy) == 2
    assert len(sweeper) == 3
    # the oldest first
    assert [_names(job) == ["job.json"] for job in jobs] == [True, True, False, False, False]
    sweeper.close()
    assert not sweeper
    assert all(_names(job) == ["job.json"] for job in jobs)


def test_a_sweeper_never_waiting_still_sweeps_beyond_its_limit(tmp_path: Path) -> None:
    sweeper = Sweeper()
    sweeper.LIMIT = 3
    jobs = _queued(tmp_path, sweeper, 5)
    assert len(sweeper) == 3
    assert [_names(job) == ["job.json"] for job in jobs] == [True, True, False, False, False]


# -- a real manager, traced -------------------------------------------------------------

_LINE = re.compile(r"^(\d+)\s+(\w+)\((.*)\)\s+=\s+(-?\d+)")

SUCCEEDS = '#!/usr/bin/env bash\nsource "$FLOW_BASH_API"\nflow_steps main\n'
SUCCEEDS += 'step_main() { flow_succeed; }\nflow_main "$@"\n'
FAILS = '#!/usr/bin/env bash\nsource "$FLOW_BASH_API"\nflow_steps main\n'
FAILS += 'step_main() { flow_fail bad "it is bad"; }\nflow_main "$@"\n'


def _flow(*args: str, cwd: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "httk_flow", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout


@pytest.mark.skipif(
    STRACE is None and os.environ.get("CI") != "true", reason="needs strace (CI has it)"
)
def test_a_succeeded_job_is_swept_after_its_final_rename_and_a_failed_one_before(
    tmp_path: Path,
) -> None:
    assert STRACE is not None, "strace is not installed (CI must have it)"
    ws = tmp_path / "ws"
    _flow("init", str(ws), cwd=tmp_path)
    for name, text in (("ok.sh", SUCCEEDS), ("bad.sh", FAILS)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    ok = _flow("-w", str(ws), "submit", str(tmp_path / "ok.sh"), cwd=tmp_path)
    bad = _flow("-w", str(ws), "submit", str(tmp_path / "bad.sh"), cwd=tmp_path)
    ok, bad = ok.strip(), bad.strip()
    trace = tmp_path / "trace"
    # -y names the directory behind each descriptor: whose directory an unlinkat removed
    argv = [STRACE, "-f", "-y", "-qq", "-o", str(trace), "-e", "trace=rename,unlinkat"]
    argv += [sys.executable, "-m", "httk_flow", "-w", str(ws), "run", "--quiet"]
    subprocess.run(argv, cwd=tmp_path, check=False, capture_output=True)
    calls = []
    for line in trace.read_text().splitlines():
        m = _LINE.match(line)
        if m is not None:
            calls.append((m.group(2), m.group(3)))

    def final_rename(key: str, state: str) -> int:
        [at] = [
            i
            for i, (name, args) in enumerate(calls)
            if name == "rename" and f"/state/{state}/" in args and key in args.split(",")[1]
        ]
        return at

    def removed(key: str) -> dict[str, int]:
        """name -> position of each directory of the job removed"""
        return {
            args.split('"')[1]: i
            for i, (name, args) in enumerate(calls)
            if name == "unlinkat" and "AT_REMOVEDIR" in args and f"/{key}" in args.split(",")[0]
        }

    # the failed job (it may be resumed) lost its directories before its final rename...
    bad_at, bad_gone = final_rename(bad, "failed"), removed(bad)
    assert sorted(bad_gone) == ["a0001", "attempts", "run"]
    assert all(at < bad_at for at in bad_gone.values())
    # ... the job that ended for good after it
    ok_at, ok_gone = final_rename(ok, "succeeded"), removed(ok)
    assert sorted(ok_gone) == ["a0001", "attempts", "run"]
    assert all(at > ok_at for at in ok_gone.values())
    # flow_fail said why on stderr: kept beside job.json
    for key, kept in ((ok, []), (bad, ["a0001.stderr"])):
        [job_dir] = list((ws / "jobs").glob(f"*/{key}"))
        assert sorted(os.listdir(job_dir)) == [*kept, "job.json"]
