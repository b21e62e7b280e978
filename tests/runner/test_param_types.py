"""Runner.param returns the type job.json holds (int, float, bool, str), through a real
manager, and in-process from a job directory's job.json; defaults keep working."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from httk_flow.protocol.states import State
from httk_flow.runner import Runner, RunnerError

from .support import Bench

TYPES = """#!/usr/bin/env python3
from httk_flow.runner import Runner

flow = Runner()


@flow.step
def main(flow: Runner) -> None:
    lines = [
        f"{k} {type(flow.param(k)).__name__} {flow.param(k)!r}"
        for k in ("i", "f", "b", "s", "n")
    ]
    lines.append(f"missing {flow.param('missing', 7)!r} {flow.param('missing', default='x')!r}")
    lines.append(" ".join(f"{k}={type(v).__name__}" for k, v in sorted(flow.params.items())))
    with open(f"{flow.job_dir}/types.txt", "w") as fh:
        fh.write("\\n".join(lines) + "\\n")
    flow.succeed()


raise SystemExit(flow.run())
"""


def test_param_keeps_the_json_type_through_flow_run(bench: Bench) -> None:
    prog = bench.script("types.py", TYPES, prelude="")
    params = {"i": 5, "f": 0.5, "b": True, "s": "5", "n": "true"}
    (job_id,) = bench.submit_many(prog, [{"params": params}])
    assert bench.run() == 0
    job = bench.job(job_id)
    assert job.state is State.SUCCEEDED, job.describe()
    assert (job.dir / "types.txt").read_text() == (
        "i int 5\n"
        "f float 0.5\n"
        "b bool True\n"
        "s str '5'\n"
        "n str 'true'\n"
        "missing 7 'x'\n"
        "b=bool f=float i=int n=str s=str\n"
    )


def test_a_string_param_from_the_command_line_stays_a_string(bench: Bench) -> None:
    prog = bench.script("types.py", TYPES, prelude="")
    params = {"i": "5", "f": "0.5", "b": "true", "s": "x", "n": ""}
    job_id = bench.submit(prog, params=params)
    assert bench.run() == 0
    job = bench.job(job_id)
    assert job.state is State.SUCCEEDED, job.describe()
    assert (job.dir / "types.txt").read_text().splitlines()[:5] == [
        "i str '5'",
        "f str '0.5'",
        "b str 'true'",
        "s str 'x'",
        "n str ''",
    ]


def _runner_on(job_dir: Path, job: object | None, **env: str) -> Runner:
    attempt = job_dir / "a0001"
    attempt.mkdir(parents=True)
    if job is not None:
        (job_dir / "job.json").write_bytes(orjson.dumps(job))
    return Runner(
        env={
            "FLOW_CONTROL_DIR": str(attempt),
            "FLOW_STEP": "main",
            "FLOW_JOB_DIR": str(job_dir),
            **env,
        }
    )


def test_job_json_wins_over_the_environment_strings(tmp_path: Path) -> None:
    r = _runner_on(tmp_path, {"params": {"n": 3, "x": 1.5, "ok": False}}, FLOW_PARAM_n="3")
    assert (r.param("n"), r.param("x"), r.param("ok")) == (3, 1.5, False)
    assert type(r.param("ok")) is bool and type(r.param("n")) is int
    assert r.params == {"n": 3, "x": 1.5, "ok": False}
    assert r.param("zz", None) is None
    with pytest.raises(RunnerError, match="parameter 'zz' is not set"):
        r.param("zz")


def test_a_job_without_params_has_none(tmp_path: Path) -> None:
    r = _runner_on(tmp_path, {"id": "x"}, FLOW_PARAM_n="stale")
    assert (r.params, r.param("n", "d")) == ({}, "d")


@pytest.mark.parametrize("job", [None, [1, 2], {"params": "bad"}])
def test_without_a_readable_job_json_the_environment_strings_are_used(
    tmp_path: Path, job: object | None
) -> None:
    r = _runner_on(tmp_path, job, FLOW_PARAM_n="42")
    assert (r.param("n"), r.param("m", 1)) == ("42", 1)
    assert r.params == {"n": "42"}
