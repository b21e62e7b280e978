"""`flow submit` on the command line: options after PROGRAM, typo'd options, --array forms."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result

from httk_flow.cli.main import cli

WARN = (
    "flow: warning: {} after the program goes to the program; "
    "put it before, or use -- to silence this\n"
)


@pytest.fixture
def script(tmp_path: Path) -> str:
    """A program that writes each of its arguments on a line of args.txt in its workdir."""
    path = tmp_path / "relax.sh"
    path.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > args.txt\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def submit(runner: CliRunner, ws: str, *args: str) -> Result:
    return runner.invoke(cli, ["-w", ws, "submit", *args], catch_exceptions=False)


def job_json(ws: str, ident: str) -> dict[str, Any]:
    [path] = Path(ws).glob(f"jobs/*/*{ident}/job.json")
    return dict(orjson.loads(path.read_bytes()))


def job_args(runner: CliRunner, ws: str, ident: str) -> list[str]:
    return list(job_json(ws, ident)["args"])


def real_flow(*args: str) -> subprocess.CompletedProcess[str]:
    """The `flow` command itself, in a process of its own."""
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("FLOW_WORKSPACE", None)
    return subprocess.run(
        [sys.executable, "-m", "httk_flow", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def one_id(r: Result) -> str:
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert len(lines) == 1 and len(lines[0]) == 32, r.stdout
    return lines[0]


# --- options after PROGRAM ---------------------------------------------------------------


def test_own_options_after_the_program_warn_once_each_and_still_reach_it(
    runner: CliRunner, ws: str, script: str
) -> None:
    r = submit(
        runner, ws, "--tag", "relax", script, "--param", "structure=Si.cif", "--time", "2h",
        "--param", "x=1",
    )  # fmt: skip
    ident = one_id(r)
    assert r.stderr == WARN.format("--param") + WARN.format("--time")
    assert job_args(runner, ws, ident) == [
        "--param", "structure=Si.cif", "--time", "2h", "--param", "x=1",
    ]  # fmt: skip
    # and the options did not apply to the job
    assert (job_json(ws, ident)["params"], job_json(ws, ident)["time"]) == ({}, None)


def test_option_equals_value_after_the_program_warns(
    runner: CliRunner, ws: str, script: str
) -> None:
    r = submit(runner, ws, script, "--priority=900", "-v", "--verbose", "--workspace=x")
    ident = one_id(r)
    assert r.stderr == WARN.format("--priority") + WARN.format("--workspace")
    assert job_args(runner, ws, ident) == ["--priority=900", "-v", "--verbose", "--workspace=x"]


def test_program_arguments_that_are_not_our_options_give_no_warning(
    runner: CliRunner, ws: str, script: str
) -> None:
    r = submit(runner, ws, "--tag", "t", script, "--verbose", "-n", "3", "--help", "tag")
    ident = one_id(r)
    assert r.stderr == ""
    assert job_args(runner, ws, ident) == ["--verbose", "-n", "3", "--help", "tag"]


def test_dashdash_before_the_program_silences_the_warning(
    runner: CliRunner, ws: str, script: str
) -> None:
    r = submit(runner, ws, "--tag", "t", "--", script, "--param", "a=1", "--time", "2h")
    ident = one_id(r)
    assert r.stderr == ""
    assert job_args(runner, ws, ident) == ["--param", "a=1", "--time", "2h"]


def test_dashdash_after_the_program_silences_what_follows_and_reaches_the_program(
    runner: CliRunner, ws: str, script: str
) -> None:
    r = submit(runner, ws, script, "--", "--param", "a=1")
    ident = one_id(r)
    assert r.stderr == ""
    assert job_args(runner, ws, ident) == ["--", "--param", "a=1"]
    # an option before that `--` is still warned about
    r = submit(runner, ws, script, "--time", "2h", "--", "--param", "a=1")
    one_id(r)
    assert r.stderr == WARN.format("--time")


def test_dashdash_as_an_option_value_does_not_silence_the_warning(
    runner: CliRunner, ws: str, script: str
) -> None:
    r = submit(runner, ws, "--name", "--", script, "--tag", "x")
    ident = one_id(r)
    assert r.stderr == WARN.format("--tag")
    assert job_args(runner, ws, ident) == ["--tag", "x"]


def test_the_program_really_receives_the_arguments_after_it(
    runner: CliRunner, ws: str, script: str, tmp_path: Path
) -> None:
    r = submit(runner, ws, "--tag", "relax", script, "--param", "structure=Si.cif", "--time", "2h")
    ident = one_id(r)
    done = real_flow("-w", ws, "run")
    assert done.returncode == 0, done.stderr
    [written] = Path(ws).glob(f"*/*/*{ident}/run/args.txt")
    assert written.read_text() == "--param\nstructure=Si.cif\n--time\n2h\n"


# --- a typo'd option before PROGRAM ------------------------------------------------------


def test_unknown_option_before_the_program_is_clicks_error_with_a_suggestion(
    ws: str, script: str
) -> None:
    done = real_flow("-w", ws, "submit", "--tga", "x", script)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "Usage: flow submit [OPTIONS] [PROGRAM] [ARGS]...\n"
        "Try 'flow submit --help' for help.\n"
        "\n"
        "Error: No such option '--tga'. Did you mean '--tag'?\n"
    )
    assert not list(Path(ws).glob("jobs/*/*"))


def test_unknown_option_after_the_program_is_the_programs(
    runner: CliRunner, ws: str, script: str
) -> None:
    r = submit(runner, ws, script, "--tga", "x")
    ident = one_id(r)
    assert r.stderr == ""
    assert job_args(runner, ws, ident) == ["--tga", "x"]


def test_a_program_starting_with_a_dash_still_needs_dashdash(runner: CliRunner, ws: str) -> None:
    r = submit(runner, ws, "--", "-weird")
    assert r.exit_code == 2
    assert r.stderr.startswith("flow: error: program '-weird': ")


# --- --array -----------------------------------------------------------------------------


def array_indices(runner: CliRunner, ws: str, spec: str) -> list[int]:
    r = runner.invoke(
        cli, ["-w", ws, "submit", "--json", "--array", spec, "/bin/true"], catch_exceptions=False
    )
    assert r.exit_code == 0, r.output
    assert r.stderr == ""
    out = []
    for job in orjson.loads(r.stdout)["jobs"]:
        out.append(job_json(ws, job["id"])["array_index"])
    return out


@pytest.mark.parametrize(
    ("spec", "indices"),
    [
        ("1-3", [1, 2, 3]),
        ("7", [7]),
        ("1,3,5", [1, 3, 5]),
        ("1-9:2", [1, 3, 5, 7, 9]),
        ("1-3,7,10-20:5", [1, 2, 3, 7, 10, 15, 20]),
        ("10-12,1", [10, 11, 12, 1]),
        ("1-9:2,2-8:2", [1, 3, 5, 7, 9, 2, 4, 6, 8]),
    ],
)
def test_array_accepts_slurms_forms(
    runner: CliRunner, ws: str, spec: str, indices: list[int]
) -> None:
    assert array_indices(runner, ws, spec) == indices


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "1-100%10",
            "--array '1-100%10': throttling with %N is not supported; submit without it: in "
            "parts (--array 1-50, later --array 51-100) or one JSON line per job in a file for "
            "--from; to run at most 10 at once, give the jobs a pool of their own (flow submit "
            "--pool throttled --array 1-100 ...) served by one manager with 10 workers "
            "(flow serve --pool throttled --workers 10)",
        ),
        (
            "1-3,7%2",
            "--array '1-3,7%2': throttling with %N is not supported; submit without it: in "
            "parts (--array 1-3, later --array 7) or one JSON line per job in a file for "
            "--from; to run at most 2 at once, give the jobs a pool of their own (flow submit "
            "--pool throttled --array 1-3,7 ...) served by one manager with 2 workers "
            "(flow serve --pool throttled --workers 2)",
        ),
        (
            "1-9:2%x",
            "--array '1-9:2%x': throttling with %N is not supported; submit without it: in "
            "parts (e.g. --array 1-50, later --array 51-100) or one JSON line per job in a "
            "file for --from; to run at most N at once, give the jobs a pool of their own "
            "(flow submit --pool throttled --array 1-9:2 ...) served by one manager with N "
            "workers (flow serve --pool throttled --workers N)",
        ),
        ("", "--array '': is empty; write e.g. 1-100, 1-9:2, 1,3,5 or 1-3,7,10-20:5"),
        (
            "1,,3",
            "--array '1,,3': has an empty item, not N, START-END or START-END:STEP; "
            "write e.g. 1-100, 1-9:2, 1,3,5 or 1-3,7,10-20:5",
        ),
        (
            "1-3,",
            "--array '1-3,': has an empty item, not N, START-END or START-END:STEP; "
            "write e.g. 1-100, 1-9:2, 1,3,5 or 1-3,7,10-20:5",
        ),
        (
            "1-x",
            "--array '1-x': has '1-x', not N, START-END or START-END:STEP; "
            "write e.g. 1-100, 1-9:2, 1,3,5 or 1-3,7,10-20:5",
        ),
        (
            "9-1",
            "--array '9-1': range '9-1' ends before it starts; write START-END with START <= END",
        ),
        ("1-9:0", "--array '1-9:0': range '1-9:0' has step 0; a STEP is 1 or more"),
        (
            "1-5,3",
            "--array '1-5,3': gives index 3 more than once; list every index once",
        ),
        (
            "1-9:2,2-8:2,8-9",
            "--array '1-9:2,2-8:2,8-9': gives index 8 more than once; list every index once",
        ),
        (
            "1-20000000",
            "--array '1-20000000': has more than 10000000 indices; submit in parts",
        ),
    ],
)
def test_array_refuses_bad_specs_naming_the_option(
    runner: CliRunner, ws: str, spec: str, message: str
) -> None:
    r = submit(runner, ws, "--array", spec, "/bin/true")
    assert (r.exit_code, r.stdout, r.stderr) == (2, "", f"flow: error: {message}\n")
    assert not list(Path(ws).glob("jobs/*/*"))


def test_the_throttle_advice_holds_a_pool_served_by_one_manager_runs_at_most_its_workers(
    runner: CliRunner, ws: str, tmp_path: Path
) -> None:
    """What the `%N` refusal advises, done: managers without --pool leave the pool's jobs
    alone, and one manager serving it with --workers 2 never runs more than 2 at once."""
    spans = tmp_path / "spans"
    spans.mkdir()
    program = tmp_path / "span.sh"
    program.write_text(
        f'#!/bin/sh\necho "$(date +%s.%N)" > {spans}/$FLOW_ARRAY_INDEX.start\n'
        f'sleep 0.5\necho "$(date +%s.%N)" > {spans}/$FLOW_ARRAY_INDEX.end\n'
    )
    program.chmod(0o755)
    assert submit(runner, ws, "--pool", "throttled", "--array", "1-6", str(program)).exit_code == 0
    flow = [sys.executable, "-m", "httk_flow", "-w", ws, "run", "--quiet"]
    run = subprocess.run([*flow, "--workers", "6"], capture_output=True, text=True, timeout=60)
    assert not list(spans.iterdir()), run.stderr  # the default pool's manager ran none
    run = subprocess.run(
        [*flow, "--pool", "throttled", "--workers", "2"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    events = []
    for i in range(1, 7):
        events.append((float((spans / f"{i}.start").read_text()), 1))
        events.append((float((spans / f"{i}.end").read_text()), -1))
    running, most = 0, 0
    for _, step in sorted(events):
        running += step
        most = max(most, running)
    assert most == 2


def test_a_placement_inside_a_jobs_own_entries_is_refused_whole(
    runner: CliRunner, ws: str, script: str
) -> None:
    # beside an existing job, a placement in its workdir or attempt directory names it
    first = submit(runner, ws, "--tag", "relax", script)
    assert first.exit_code == 0, first.output
    [job] = Path(ws).glob("jobs/*/relax--*")
    for inner in ("run", "a0001"):
        where = f"{job.relative_to(ws)}/{inner}"
        r = submit(runner, ws, "--placement", where, script)
        assert (r.exit_code, r.stdout) == (2, "")
        assert r.stderr == (
            f"flow: error: placement '{where}': lies inside the {inner}/ of job {job.name}, "
            "which only that job may use; place jobs in a directory of their own (a job's "
            "children are placed inside it by flow)\n"
        )
    assert len(list(Path(ws).glob("jobs/*/*/job.json"))) == 1


def test_a_placement_within_another_jobs_directory_is_refused_whole(
    runner: CliRunner, ws: str, script: str
) -> None:
    """Where a job's children live (or below): flow would take the new job for its child,
    cancelled with it (`flow cancel` takes a job's children along). A directory merely
    named like a job, holding none, is a placement like any other."""
    first = submit(runner, ws, "--tag", "relax", script)
    assert first.exit_code == 0, first.output
    [job] = Path(ws).glob("jobs/*/relax--*")
    for where in (f"{job.relative_to(ws)}", f"{job.relative_to(ws)}/more/v1"):
        r = submit(runner, ws, "--placement", where, script)
        assert (r.exit_code, r.stdout) == (2, "")
        assert r.stderr == (
            f"flow: error: placement '{where}': is within the directory of job {job.name}, "
            "where flow places only its children; place jobs in a directory of their own\n"
        )
    assert len(list(Path(ws).rglob("job.json"))) == 1
    r = submit(runner, ws, "--placement", f"runs/{job.name}", script)
    assert r.exit_code == 0, r.output
    assert len(list(Path(ws).glob(f"runs/{job.name}/*/job.json"))) == 1


def test_a_placement_through_a_symbolic_link_is_refused_whole(
    runner: CliRunner, ws: str, script: str, tmp_path: Path
) -> None:
    """A link in a placement may lead out of the workspace (a manager would refuse to run
    the job there, after it was written) or into a job's own directory (taken for its
    child): refused at submission, from a flag or a JSONL line, with nothing written."""
    first = submit(runner, ws, "--tag", "relax", script)
    assert first.exit_code == 0, first.output
    [job] = Path(ws).glob("jobs/*/relax--*")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (Path(ws) / "runs").mkdir()
    (Path(ws) / "runs" / "into").symlink_to(job)
    (Path(ws) / "runs" / "out").symlink_to(outside)
    for where, link in (("runs/into", "runs/into"), ("runs/out/v1", "runs/out")):
        r = submit(runner, ws, "--placement", where, script)
        assert (r.exit_code, r.stdout) == (2, "")
        assert r.stderr == (
            f"flow: error: placement '{where}': passes through the symbolic link {link}; "
            "flow places jobs only in the workspace's own directories (a link may lead out "
            "of it, or into a job's)\n"
        )
    lines = tmp_path / "jobs.jsonl"
    lines.write_text('{"placement": "runs/fine"}\n{"placement": "runs/out"}\n')
    r = submit(runner, ws, "--from", str(lines), script)
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr.startswith(f"flow: error: {lines}:2: placement 'runs/out': passes through")
    assert list(outside.iterdir()) == []
    assert len(list(Path(ws).rglob("job.json"))) == 1
    r = submit(runner, ws, "--placement", "runs/real/v1", script)
    assert r.exit_code == 0, r.output
    assert len(list(Path(ws).glob("runs/real/v1/*/job.json"))) == 1
