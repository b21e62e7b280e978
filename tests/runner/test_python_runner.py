"""httk_flow.runner: steps, outcomes, children and context, in-process against a fake
attempt directory, and end to end through a real manager."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import duplicate_note, published_outcome, waiting_outcome

from httk_flow.errors import InvalidOutcome
from httk_flow.protocol.outcome import JoinMode, read_outcome
from httk_flow.protocol.states import State
from httk_flow.runner import Child, DuplicateOutcome, Runner, RunnerError

from .support import Bench


@pytest.fixture
def attempt(tmp_path: Path) -> Path:
    d = tmp_path / "attempt"
    d.mkdir()
    return d


def env_of(attempt: Path, step: str = "main", **extra: str) -> dict[str, str]:
    return {
        "FLOW_CONTROL_DIR": str(attempt),
        "FLOW_STEP": step,
        "FLOW_JOB_DIR": str(attempt.parent),
        "FLOW_WORKDIR": str(attempt.parent),
        "FLOW_ATTEMPT_ID": "a0001",
        **extra,
    }


def outcome_json(attempt: Path) -> dict[str, object]:
    return published_outcome(attempt)


def runner(attempt: Path, step: str = "main", **extra: str) -> Runner:
    return Runner(env=env_of(attempt, step, **extra))


# -- outcomes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda r: r.succeed(), {"action": "succeed", "message": ""}),
        (lambda r: r.succeed("ok"), {"action": "succeed", "message": "ok"}),
        (lambda r: r.fail("bad"), {"action": "fail", "message": "bad"}),
        (
            lambda r: r.fail("bad", "bad_input"),
            {"action": "fail", "message": "bad", "code": "bad_input"},
        ),
        (lambda r: r.advance("two", "m"), {"action": "advance", "message": "m", "step": "two"}),
        (lambda r: r.retry("later"), {"action": "retry", "message": "later"}),
        (lambda r: r.pause("look"), {"action": "pause", "message": "look"}),
    ],
)
def test_each_outcome_method_publishes_its_outcome(
    attempt: Path, call: object, expected: dict[str, object]
) -> None:
    r = runner(attempt)
    call(r)  # type: ignore[operator]
    assert outcome_json(attempt) == expected
    assert r.has_outcome() and os.listdir(attempt) == ["outcome.ready"]


def test_a_durable_workspace_publishes_the_same_outcome(attempt: Path) -> None:
    runner(attempt, FLOW_DURABLE="1").succeed("synced")
    assert outcome_json(attempt) == {"action": "succeed", "message": "synced"}


def test_a_second_outcome_raises_and_flags_a_duplicate(attempt: Path) -> None:
    r = runner(attempt)
    r.succeed()
    with pytest.raises(DuplicateOutcome):
        r.fail("again")
    with pytest.raises(InvalidOutcome) as info:
        read_outcome(str(attempt))
    assert info.value.message == (
        "the attempt published more than one outcome: succeed, then fail; publishing an "
        "outcome does not end the step, so return (or exit) right after it"
    )


def test_an_outcome_published_by_another_process_counts_as_the_first(attempt: Path) -> None:
    runner(attempt).succeed()
    with pytest.raises(DuplicateOutcome):
        runner(attempt).succeed()


def test_outside_an_attempt_run_says_how_to_run_the_program(
    capsys: pytest.CaptureFixture[str],
) -> None:
    r = Runner({"main": lambda f: f.succeed()}, env={})
    assert r.run() == 2
    assert "run this program through flow" in capsys.readouterr().err


# -- steps and run() ------------------------------------------------------------------------


def test_run_dispatches_on_the_step_by_decorator_name_or_dict(attempt: Path) -> None:
    seen: list[str] = []
    r = runner(attempt, "second")

    @r.step
    def first(flow: Runner) -> None:
        seen.append("first")

    @r.step("second")
    def not_the_name(flow: Runner) -> None:
        seen.append("second")
        flow.advance("first")

    assert r.run() == 0
    assert seen == ["second"]
    assert outcome_json(attempt)["step"] == "first"

    other = attempt.parent / "other"
    other.mkdir()
    r2 = Runner({"main": lambda f: f.succeed("from a dict")}, env=env_of(other))
    assert r2.run() == 0 and outcome_json(other)["message"] == "from a dict"


def test_an_unknown_step_fails_naming_it(attempt: Path) -> None:
    r = Runner({"a": lambda f: f.succeed()}, env=env_of(attempt, "b"))
    assert r.run() == 0
    assert outcome_json(attempt) == {
        "action": "fail",
        "message": "step b: step 'b' is not a step of this runner (steps: a)",
        "code": "protocol_error",
    }


def test_an_unknown_main_step_says_which_step_to_submit_with(attempt: Path) -> None:
    r = Runner({"prepare": lambda f: f.succeed(), "b": lambda f: f.succeed()}, env=env_of(attempt))
    assert r.run() == 0
    assert outcome_json(attempt) == {
        "action": "fail",
        "message": "step main: step 'main' is not a step of this runner (steps: prepare, b); a "
        "job starts at step main unless flow submit --step names another: submit with --step "
        "prepare, and continue this one with flow resume JOB --step prepare",
        "code": "protocol_error",
    }


def test_an_exception_in_a_step_fails_naming_step_exception_and_line(
    attempt: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def main(flow: Runner) -> None:
        int("not a number")

    assert Runner({"main": main}, env=env_of(attempt)).run() == 0
    # the whole stack on stderr (the attempt's), from the step's frame on
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):\n"), err
    assert 'int("not a number")' in err and "in main\n" in err, err
    assert os.path.join("httk_flow", "runner", "__init__.py") not in err, err
    assert err.endswith("ValueError: invalid literal for int() with base 10: 'not a number'\n")
    out = outcome_json(attempt)
    assert out["code"] == "step_error"
    assert str(out["message"]).startswith(
        "step main: ValueError: invalid literal for int() with base 10: 'not a number' "
        "(at test_python_runner.py:"
    )
    assert str(out["message"]).endswith(" in main)")


def test_a_step_returning_without_an_outcome_fails_naming_it(attempt: Path) -> None:
    Runner({"main": lambda f: None}, env=env_of(attempt)).run()
    out = outcome_json(attempt)
    assert out["code"] == "protocol_error"
    assert str(out["message"]).startswith("step main: returned without publishing an outcome")


def test_advancing_to_a_step_the_runner_lacks_fails_naming_it(attempt: Path) -> None:
    Runner({"main": lambda f: f.advance("nowhere")}, env=env_of(attempt)).run()
    out = outcome_json(attempt)
    assert out["code"] == "protocol_error"
    assert "step 'nowhere' is not a step of this runner (steps: main)" in str(out["message"])


def test_a_second_outcome_inside_run_leaves_the_duplicate_flag(attempt: Path) -> None:
    def main(flow: Runner) -> None:
        flow.succeed()
        flow.succeed()

    assert Runner({"main": main}, env=env_of(attempt)).run() == 0
    assert duplicate_note(attempt) == "succeed\n"


# -- children -------------------------------------------------------------------------------


def test_wait_publishes_the_join_and_the_children(attempt: Path) -> None:
    prog = attempt.parent / "child.py"
    prog.write_text("#!/bin/sh\n")
    prog.chmod(0o755)
    r = Runner({"main": lambda f: None, "collect": lambda f: None}, env=env_of(attempt))
    assert r.spawn() == "c1"
    assert (
        r.spawn(tag="t-2", step="collect", params={"n": 2, "x": 0.5, "ok": True, "s": "é"}) == "c2"
    )
    cwd = os.getcwd()
    os.chdir(attempt.parent)
    try:
        assert r.spawn(label="third", program="child.py", priority=9) == "third"
    finally:
        os.chdir(cwd)
    r.wait("collect", "any-succeeded", on_impossible="main")
    out = waiting_outcome(attempt, "collect", JoinMode.ANY_SUCCEEDED, "main")
    c1, c2, c3 = out.children
    assert (c1.label, c1.tag, c1.program, c1.params) == ("c1", None, None, {})
    assert (c2.tag, c2.step, c2.params) == (
        "t-2",
        "collect",
        {"n": 2, "x": 0.5, "ok": True, "s": "é"},
    )
    assert (c3.label, c3.program, c3.priority) == ("third", str(prog), 9)


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"tag": "a b"}, "tag 'a b'"),
        ({"params": {"bad-key": 1}}, "parameter name 'bad-key'"),
        ({"params": {"k": [1]}}, "param 'k' must be a string, number or bool"),
        ({"priority": 1000}, "priority 1000 is outside 0-999"),
        ({"label": ".x"}, "child label '.x'"),
        ({"program": "/does/not/exist"}, "is not an executable file"),
        ({"step": "elsewhere"}, "the child would start at step 'elsewhere'"),
    ],
)
def test_spawn_refuses_bad_arguments_and_the_step_ends_failed(
    attempt: Path, kwargs: dict[str, object], problem: str
) -> None:
    def main(flow: Runner) -> None:
        with pytest.raises(RunnerError, match="spawn: "):
            flow.spawn(**kwargs)  # type: ignore[arg-type]
        flow.spawn()
        flow.wait("main")  # the earlier misuse wins over the wait

    assert Runner({"main": main}, env=env_of(attempt)).run() == 0
    out = outcome_json(attempt)
    assert out["action"] == "fail" and out["code"] == "protocol_error"
    assert problem in str(out["message"]), out


def test_a_join_over_no_children_fails(attempt: Path) -> None:
    Runner({"main": lambda f: f.wait("main")}, env=env_of(attempt)).run()
    out = outcome_json(attempt)
    assert out["code"] == "protocol_error"
    assert "no children were spawned" in str(out["message"])


def test_children_are_parsed_into_typed_records(attempt: Path) -> None:
    (attempt / "children").write_text(
        "c1 0123 succeeded /ws/a dir/c1\nc2 4567 failed /ws/c2\nc3 89ab missing /ws/c3\n"
    )
    kids = runner(attempt).children()
    assert kids == [
        Child("c1", "0123", State.SUCCEEDED, "/ws/a dir/c1"),
        Child("c2", "4567", State.FAILED, "/ws/c2"),
        Child("c3", "89ab", None, "/ws/c3"),
    ]
    assert [k.succeeded for k in kids] == [True, False, False]


def test_children_without_a_join_raise(attempt: Path) -> None:
    with pytest.raises(RunnerError, match="step that follows a wait"):
        runner(attempt).children()


# -- context --------------------------------------------------------------------------------


def test_params_and_defaults(attempt: Path) -> None:
    r = runner(attempt, FLOW_PARAM_n="42", FLOW_PARAM_s=" a\nb ")
    assert (r.param("n"), r.param("s"), r.param("zz", "d")) == ("42", " a\nb ", "d")
    assert r.params == {"n": "42", "s": " a\nb "}
    with pytest.raises(RunnerError, match="parameter 'zz' is not set"):
        r.param("zz")


def test_restart_facts_come_from_the_environment(attempt: Path) -> None:
    # without context.json, a restart is told in its environment (FLOW_PREVIOUS_END)
    r = runner(
        attempt,
        FLOW_ATTEMPT="3",
        FLOW_IS_RESTART="1",
        FLOW_UNCLEAN_RESTART="1",
        FLOW_PREVIOUS_END="interrupted",
    )
    assert (r.attempt, r.is_restart, r.is_unclean_restart, r.previous_end) == (
        3,
        True,
        True,
        "interrupted",
    )
    fresh = attempt.parent / "fresh"
    fresh.mkdir()
    r2 = runner(fresh, FLOW_IS_RESTART="0", FLOW_UNCLEAN_RESTART="0", FLOW_ATTEMPT="1")
    assert (r2.attempt, r2.is_restart, r2.is_unclean_restart, r2.previous_end) == (
        1,
        False,
        False,
        None,
    )


def test_log_writes_a_line_naming_step_and_attempt(
    attempt: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runner(attempt, "prepare").log("hello")
    assert capsys.readouterr().err.endswith(" flow[prepare a0001]: hello\n")


# -- through a real manager -----------------------------------------------------------------

FAMILY = """#!/usr/bin/env python3
from httk_flow.runner import Runner

flow = Runner()


@flow.step
def main(flow: Runner) -> None:
    for n in range(1, 4):
        flow.spawn(tag=f"part-{n}", step="child", params={"n": n})
    flow.wait("collect", "all_succeeded")


@flow.step
def child(flow: Runner) -> None:
    n = int(flow.param("n"))
    with open(f"{flow.job_dir}/result", "w") as fh:
        fh.write(str(n * n))
    flow.succeed(f"child {n}")


@flow.step
def collect(flow: Runner) -> None:
    total = 0
    for c in flow.children():
        assert c.succeeded, c
        with open(f"{c.path}/result") as fh:
            total += int(fh.read())
    flow.succeed(f"total {total} from {len(flow.children())} children")


@flow.step
def broken(flow: Runner) -> None:
    raise RuntimeError("the solver diverged")


raise SystemExit(flow.run())
"""


def test_a_python_runner_spawns_joins_and_fails_through_a_manager(bench: Bench) -> None:
    prog = bench.script("family.py", FAMILY, prelude="")
    family, broken = bench.submit_many(prog, [{}, {"step": "broken"}])
    assert bench.run() == 1
    job = bench.job(family)
    assert job.state is State.SUCCEEDED, job.describe()
    assert job.message == "total 14 from 3 children"
    job = bench.job(broken)
    assert (job.state, job.code) == (State.FAILED, "step_error"), job.describe()
    assert job.reason.startswith(
        "step broken: RuntimeError: the solver diverged (at line 34 in broken)"
    )
