"""`flow submit` on time and budgets: --time (the request), --time-limit and its factor,
--max-attempts; the same as JSONL keys; what job.json records; and the errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result

from httk_flow.cli.main import cli


def submit(runner: CliRunner, ws: str, *args: str, stdin: str | None = None) -> Result:
    return runner.invoke(cli, ["-w", ws, "submit", *args], input=stdin, catch_exceptions=False)


def job_json(ws: str, ident: str) -> dict[str, Any]:
    [path] = Path(ws).glob(f"jobs/*/{ident}*/job.json")
    return dict(orjson.loads(path.read_bytes()))


def test_the_help_names_the_request_the_limit_its_factor_and_the_life_budget(
    runner: CliRunner,
) -> None:
    out = runner.invoke(cli, ["submit", "--help"]).output
    block = out[out.index("  --time DURATION") : out.index("  --workdir")]
    assert block == (
        "  --time DURATION                 Expected runtime (90s, 15m, 2h): what a\n"
        "                                  manager fits into the time it has left.\n"
        "  --time-limit DURATION           Stop an attempt that runs this long (TERM,\n"
        "                                  KILL after the kill grace): a failure, code\n"
        "                                  time_limit, retried within --retries.\n"
        "  --time-limit-factor F           Multiply the limit (and --time) by F after\n"
        "                                  each attempt of the step stopped at it.\n"
        "                                  [default: 1]\n"
        "  --retries INTEGER               Extra attempts per activation after a process\n"
        "                                  failure.  [default: 2]\n"
        "  --max-attempts N                Failed attempts over the job's life before it\n"
        "                                  fails (drains, takeovers and advances do not\n"
        "                                  count; flow resume starts it again).\n"
        "                                  [default: 100]\n"
    )


def test_the_limit_its_factor_and_max_attempts_are_members_of_job_json(
    runner: CliRunner, ws: str
) -> None:
    r = submit(
        runner,
        ws,
        "--tag",
        "t",
        "--time",
        "90s",
        "--time-limit",
        "2m",
        "--time-limit-factor",
        "1.5",
        "--max-attempts",
        "7",
        "true",
    )
    assert r.exit_code == 0, r.output
    d = job_json(ws, "t--")
    assert (d["time"], d["time_limit"], d["time_limit_factor"], d["max_attempts"]) == (
        90.0,
        120.0,
        1.5,
        7,
    )


def test_a_job_without_a_limit_writes_job_json_as_before(runner: CliRunner, ws: str) -> None:
    assert submit(runner, ws, "--tag", "t", "--time", "5m", "true").exit_code == 0
    d = job_json(ws, "t--")
    assert "time_limit" not in d and "time_limit_factor" not in d
    assert (d["time"], d["max_attempts"]) == (300.0, 100)


def test_the_jsonl_keys_set_the_limit_its_factor_and_max_attempts(
    runner: CliRunner, ws: str
) -> None:
    lines = (
        '{"tag": "a", "time": "1m", "time_limit": "2m", "time_limit_factor": 2, '
        '"max_attempts": 3}\n'
        '{"tag": "b", "time_limit": 30}\n'
        '{"tag": "c"}\n'
    )
    r = submit(runner, ws, "--max-attempts", "9", "--from", "-", "true", stdin=lines)
    assert r.exit_code == 0, r.output
    a, b, c = (job_json(ws, f"{t}--") for t in "abc")
    assert (a["time"], a["time_limit"], a["time_limit_factor"], a["max_attempts"]) == (
        60.0,
        120.0,
        2.0,
        3,
    )
    assert (b["time_limit"], b["time_limit_factor"], b["max_attempts"]) == (30.0, 1.0, 9)
    assert "time_limit" not in c and c["max_attempts"] == 9


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ["--time", "10m", "--time-limit", "5m"],
            "flow: error: --time-limit 5m: is shorter than the time request --time 10m: the "
            "job would be stopped before it is expected to finish; give a limit of at least "
            "the request (the request is what a manager fits into its remaining time; the "
            "limit is when the attempt is stopped)\n",
        ),
        (
            ["--time-limit-factor", "2"],
            "flow: error: --time-limit-factor 2: grows a time limit, and the job has none; "
            "give --time-limit too\n",
        ),
        (
            ["--time-limit", "1m", "--time-limit-factor", "0.5"],
            "flow: error: --time-limit-factor 0.5: must be a number from 1 to 100; 1 keeps "
            "the limit; 2 doubles it after each attempt stopped at it\n",
        ),
        (
            ["--time-limit", "soon"],
            "flow: error: --time-limit 'soon': is not a duration; write e.g. 90s, 15m, 2h, "
            "1h30m or 01:30:00\n",
        ),
        (
            ["--time-limit", "0s"],
            "flow: error: --time-limit: must be a positive duration of less than ten years\n",
        ),
        (["--max-attempts", "0"], "flow: error: --max-attempts 0: must be from 1 to 100000\n"),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else "",
)
def test_bad_times_and_budgets_are_usage_errors_that_say_what_to_do(
    runner: CliRunner, ws: str, args: list[str], error: str
) -> None:
    r = runner.invoke(cli, ["-w", ws, "submit", *args, "true"])
    assert (r.exit_code, r.stderr) == (2, error)
    assert not list(Path(ws).glob("jobs/*/*"))


def test_a_bad_jsonl_limit_names_its_line(runner: CliRunner, ws: str) -> None:
    lines = '{"tag": "ok"}\n{"time": 60, "time_limit": 30}\n'
    r = runner.invoke(cli, ["-w", ws, "submit", "--from", "-", "true"], input=lines)
    assert r.exit_code == 2
    assert r.stderr.startswith("flow: error: <stdin>:2: --time-limit 30s: is shorter than")
    r = runner.invoke(
        cli, ["-w", ws, "submit", "--from", "-", "true"], input='{"time_limit_factor": "x"}\n'
    )
    assert (r.exit_code, r.stderr) == (
        2,
        "flow: error: <stdin>:1: time_limit_factor: must be a number\n",
    )
    assert not list(Path(ws).glob("jobs/*/*"))
