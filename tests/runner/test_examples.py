"""The programs in examples/ run to success through real managers."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from helpers import wait_for

from httk_flow.protocol.states import State

from .support import EXAMPLES, Bench


def squares(n: int) -> int:
    return sum(i * i for i in range(1, n + 1))


def collatz_steps(x: int) -> int:
    steps = 0
    while x > 1:
        x = 3 * x + 1 if x % 2 else x // 2
        steps += 1
    return steps


def expected_fanout_csv(n: int) -> str:
    rows = [f"p{x},{x},{x * x},{collatz_steps(x)}" for x in range(1, n + 1)]
    return "label,x,square,collatz_steps\n" + "".join(r + "\n" for r in rows)


@pytest.mark.parametrize("program", ["three_step.sh", "python_runner.py"])
def test_the_three_step_example_computes_its_result(bench: Bench, program: str) -> None:
    ident = bench.submit(str(EXAMPLES / program), step="prepare", params={"n": "100"})
    assert bench.run() == 0
    job = bench.job(ident)
    assert job.state is State.SUCCEEDED, job.describe()
    assert job.message == f"sum of squares 1..100 = {squares(100)}"
    assert (job.dir / "result.csv").read_text() == f"n,sum_of_squares\n100,{squares(100)}\n"
    assert [f.get("step") for f in job.commits()] == ["compute", "collect", "collect"]


def test_the_fanout_example_aggregates_its_fifty_children(bench: Bench) -> None:
    ident = bench.submit(str(EXAMPLES / "fanout" / "parent.sh"), step="spawn")
    assert bench.run(workers=4) == 0
    job = bench.job(ident)
    assert job.state is State.SUCCEEDED, job.describe()
    assert (job.dir / "run" / "results.csv").read_text() == expected_fanout_csv(50)


@pytest.mark.slow
def test_the_fanout_example_with_500_children_under_two_managers(bench: Bench) -> None:
    n = 500
    ident = bench.submit(str(EXAMPLES / "fanout" / "parent.sh"), step="spawn", params={"n": str(n)})
    started = time.monotonic()
    managers = [bench.start(workers=4), bench.start(workers=4)]
    for p in managers:
        assert p.wait(120) == 0
    elapsed = time.monotonic() - started
    parent = bench.job(ident)
    assert parent.state is State.SUCCEEDED, parent.describe()
    assert (parent.dir / "run" / "results.csv").read_text() == expected_fanout_csv(n)
    children = [j for j in bench.all_jobs() if j.handle.job_id != ident]
    assert len(children) == n
    for child in children:
        assert child.state is State.SUCCEEDED, child.describe()
        # committed once: one attempt, one commit, one final state
        assert len(child.commits()) == 1, child.describe()
        assert child.attempt_ids() == ["a0001"]
    # both managers took part
    runners = {c.commits()[0]["by"] for c in children}
    assert len(runners) == 2, runners
    print(f"500 children under two managers: {elapsed:.1f} s")


def test_the_restartable_example_runs_to_the_end(bench: Bench) -> None:
    ident = bench.submit(
        str(EXAMPLES / "restartable.sh"), params={"iterations": "10", "delay": "0.01"}
    )
    assert bench.run() == 0
    job = bench.job(ident)
    assert job.state is State.SUCCEEDED, job.describe()
    assert job.message == f"sum of 0..9 = {sum(range(10))}"
    assert not (job.dir / "run" / "resumes.log").exists()


@pytest.mark.slow
def test_the_restartable_example_continues_from_its_checkpoint_after_kill_9(
    bench: Bench,
) -> None:
    total = 40
    ident = bench.submit(
        str(EXAMPLES / "restartable.sh"), params={"iterations": str(total), "delay": "0.1"}
    )
    first = bench.start(command="serve")
    run_dir = Path(bench.root)

    def checkpoint() -> int:
        found = list(run_dir.glob("jobs/*/*/run/checkpoint"))
        return int(found[0].read_text().split()[0]) if found else 0

    wait_for(lambda: checkpoint() >= 5, timeout=30)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    reached = checkpoint()
    assert reached < total

    assert bench.run() == 0
    job = bench.job(ident)
    assert job.state is State.SUCCEEDED, job.describe()
    assert job.message == f"sum of 0..{total - 1} = {sum(range(total))}"
    log = job.dir / "run" / "resumes.log"
    assert log.exists(), (
        "the attempt after the kill did not resume: flow_is_restart was false after an "
        "interrupted attempt\n" + job.describe()
    )
    resumes = log.read_text().splitlines()
    assert len(resumes) == 1, resumes
    attempt, resumed_at = resumes[0].removeprefix("attempt ").split(" resumed at ")
    assert attempt == "a0002"
    # the orphaned first attempt may have gone on a little before it was stopped
    assert reached <= int(resumed_at) < total
    assert "restarted (unclean: 1)" in job.stderr()


def _doc_block(lang: str) -> str:
    text = (EXAMPLES.parent / "docs" / "bash-api.md").read_text()
    return text.split(f"```{lang}\n", 1)[1].split("```", 1)[0]


def test_the_quick_start_of_the_bash_api_doc_runs(bench: Bench) -> None:
    prog = bench.script("doc.sh", _doc_block("bash"), prelude="")
    ident = bench.submit(prog, step="prepare", params={"n": "5"})
    assert bench.run() == 0
    job = bench.job(ident)
    assert job.state is State.SUCCEEDED, job.describe()
    assert job.message == "total 14"


def test_the_python_example_of_the_bash_api_doc_runs(bench: Bench) -> None:
    prog = bench.script("doc.py", _doc_block("python"), prelude="")
    ident = bench.submit(prog, step="spawn")
    assert bench.run() == 0
    job = bench.job(ident)
    assert job.state is State.SUCCEEDED, job.describe()
    assert job.message == f"total {squares(10)}"
