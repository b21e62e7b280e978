"""Steering from a script and from a terminal: --json, --quiet, the bulk prompt's count,
the lock's JSON, the grouped help, Ctrl-C's exit status and `logs -f` before a start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
from click.testing import CliRunner
from helpers import wait_for

from httk_flow.cli.app import App
from httk_flow.cli.main import cli

FLOW = [sys.executable, "-m", "httk_flow"]


def _submit(runner: CliRunner, ws: str, tag: str) -> dict[str, str]:
    r = runner.invoke(cli, ["-w", ws, "submit", "--json", "--tag", tag, "true"])
    assert r.exit_code == 0, r.output
    [job] = orjson.loads(r.stdout)["jobs"]
    assert isinstance(job, dict)
    return job


def test_cancel_json_names_each_change_and_each_refusal(runner: CliRunner, ws: str) -> None:
    job = _submit(runner, ws, "a")
    r = runner.invoke(cli, ["-w", ws, "cancel", "--json", "a", "--reason", "done"])
    assert r.exit_code == 0, r.output
    assert orjson.loads(r.stdout) == {
        "jobs": [{"id": job["id"], "key": job["key"], "from": "submitted", "to": "cancelled"}],
        "errors": [],
    }
    r = runner.invoke(cli, ["-w", ws, "cancel", "--json", "a"])
    doc = orjson.loads(r.stdout)
    assert doc["jobs"] == [
        {
            "id": job["id"],
            "key": job["key"],
            "from": "cancelled",
            "to": "cancelled",
            "note": "already cancelled",
        }
    ]
    r = runner.invoke(cli, ["-w", ws, "resume", "--json", "a"])
    assert (r.exit_code, r.stderr) == (2, "")
    assert orjson.loads(r.stdout) == {
        "jobs": [],
        "errors": [
            {
                "job": job["key"],
                "error": f"job {job['key']}: is cancelled; only paused or failed jobs can be "
                "resumed",
                "exit_code": 2,
            }
        ],
    }


def test_quiet_prints_nothing_but_the_exit_status_tells(runner: CliRunner, ws: str) -> None:
    _submit(runner, ws, "q")
    r = runner.invoke(cli, ["-w", ws, "resume", "-q", "q"])
    assert (r.exit_code, r.stdout, r.stderr) == (2, "", r.stderr)
    assert "only paused or failed jobs can be resumed" in r.stderr
    r = runner.invoke(cli, ["-w", ws, "cancel", "-q", "q"])
    assert (r.exit_code, r.stdout, r.stderr) == (0, "", "")


def test_the_bulk_prompt_counts_only_the_jobs_it_would_change(runner: CliRunner, ws: str) -> None:
    for t in ("x", "y", "z"):
        _submit(runner, ws, t)
    assert runner.invoke(cli, ["-w", ws, "cancel", "z"]).exit_code == 0
    app = App()
    app.is_terminal = True  # the prompt is for people at a terminal
    r = runner.invoke(cli, ["-w", ws, "cancel", "--all"], input="n\n", obj=app)
    assert r.exit_code == 1
    assert "cancel 2 job(s) (1 other job(s) left as they are)? [y/N]" in r.stderr
    app = App()
    app.is_terminal = True
    r = runner.invoke(cli, ["-w", ws, "cancel", "--all"], input="y\n", obj=app)
    assert r.exit_code == 0, r.output
    lines = sorted(r.stdout.splitlines())
    assert len(lines) == 2 and all(line.endswith(": submitted -> cancelled") for line in lines)


def test_lock_and_unlock_speak_json(runner: CliRunner, ws: str) -> None:
    r = runner.invoke(cli, ["-w", ws, "lock", "--json", "--reason", "upgrade"])
    assert r.exit_code == 0, r.output
    lock = orjson.loads(r.stdout)["lock"]
    assert (lock["reason"], lock["stale"]) == ("upgrade", False)
    assert set(lock) == {"user", "host", "since", "reason", "stale"}
    assert orjson.loads(runner.invoke(cli, ["-w", ws, "unlock", "--json"]).stdout) == {
        "released": True
    }
    assert orjson.loads(runner.invoke(cli, ["-w", ws, "unlock", "--json"]).stdout) == {
        "released": False
    }


def test_help_groups_the_commands() -> None:
    out = CliRunner().invoke(cli, ["--help"], terminal_width=100).stdout
    titles = [line for line in out.splitlines() if line and not line.startswith(" ")]
    sections = titles[titles.index("Options:") + 1 :]
    assert sections == ["Submit:", "Run:", "Inspect:", "Steer:", "Maintain:", "Cluster:"]
    body = out.splitlines()[out.splitlines().index("Submit:") :]
    listed = [line.split()[0] for line in body if line.startswith("  ") and line[2] != " "]
    assert sorted(listed) == sorted(cli.list_commands(None))  # type: ignore[arg-type]


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "NO_COLOR": "1", "FLOW_WORKSPACE": str(tmp_path / "ws")}


def test_ctrl_c_exits_130(tmp_path: Path) -> None:
    env = _env(tmp_path)
    subprocess.run([*FLOW, "init", env["FLOW_WORKSPACE"]], check=True, env=env)
    subprocess.run([*FLOW, "submit", "--tag", "w", "true"], check=True, env=env)
    p = subprocess.Popen(
        [*FLOW, "wait", "w"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    # nothing runs the job: the wait goes on until it is interrupted
    wait_for(lambda: _waiting(p.pid), 20)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=20)
    assert p.returncode == 130, (out, err)
    assert err.decode().splitlines()[-1] == "flow: interrupted"


def _waiting(pid: int) -> bool:
    """The process is past its start-up (its command module is loaded and it sleeps
    between two looks). A sleep, not any wait in the kernel: a fresh install's first start
    waits for the disk as it reads its modules, and a SIGINT there interrupts Python's
    own start-up (exit 1, not 130)."""
    try:
        with open(f"/proc/{pid}/wchan") as fh:
            where = fh.read()
    except OSError:
        return False
    return any(w in where for w in ("nanosleep", "poll", "select"))


def test_logs_follow_waits_for_the_first_attempt(tmp_path: Path) -> None:
    env = _env(tmp_path)
    subprocess.run([*FLOW, "init", env["FLOW_WORKSPACE"]], check=True, env=env)
    script = tmp_path / "hello.sh"
    script.write_text("#!/bin/sh\necho hello from the job\n")
    script.chmod(0o755)
    subprocess.run([*FLOW, "submit", "--tag", "late", str(script)], check=True, env=env)
    follower = subprocess.Popen(
        [*FLOW, "logs", "-f", "late"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert follower.stderr is not None
    first = follower.stderr.readline().decode()
    assert (
        first.startswith("flow: waiting for the first attempt of job ") and "(submitted)" in first
    )
    assert follower.poll() is None
    run = subprocess.run([*FLOW, "run"], env=env, capture_output=True, timeout=60)
    assert run.returncode == 0, run.stderr
    out, _ = follower.communicate(timeout=30)
    assert (follower.returncode, out) == (0, b"hello from the job\n")


def test_logs_follow_of_a_job_that_ended_without_running_says_so(
    runner: CliRunner, ws: str
) -> None:
    _submit(runner, ws, "never")
    assert runner.invoke(cli, ["-w", ws, "cancel", "never"]).exit_code == 0
    r = runner.invoke(cli, ["-w", ws, "logs", "-f", "never"])
    assert r.exit_code == 2
    assert "ended cancelled without running" in r.stderr
