"""shell/flow.sh in a bash process of its own, against a fake attempt directory.

These check what each function writes and returns; test_bash_end_to_end.py checks the
same functions through a real manager.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import duplicate_note, published_outcome, waiting_outcome

from httk_flow.errors import InvalidOutcome
from httk_flow.protocol.outcome import Action, JoinMode, read_outcome

from .support import FLOW_SH, bash

#: the public functions of the contract (docs: CLI.md, "Bash runner API")
PUBLIC = {
    "flow_steps",
    "flow_main",
    "flow_succeed",
    "flow_fail",
    "flow_advance",
    "flow_retry",
    "flow_pause",
    "flow_spawn",
    "flow_wait",
    "flow_children",
    "flow_param",
    "flow_is_restart",
    "flow_is_unclean_restart",
    "flow_log",
}


@pytest.fixture
def attempt(tmp_path: Path) -> Path:
    d = tmp_path / "attempt"
    d.mkdir()
    return d


def env_of(attempt: Path, **extra: str) -> dict[str, str]:
    return {"FLOW_CONTROL_DIR": str(attempt), "FLOW_STEP": "main", **extra}


def outcome_json(attempt: Path) -> dict[str, object]:
    return published_outcome(attempt)


def run(attempt: Path, script: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    return bash(script, env=env_of(attempt, **env), cwd=str(attempt))


# -- the file itself ----------------------------------------------------------------------


def test_shellcheck_finds_nothing_in_flow_sh_or_the_examples() -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed")
    repo = FLOW_SH.parent.parent
    files = [str(FLOW_SH), *map(str, sorted((repo / "examples").rglob("*.sh")))]
    done = subprocess.run(["shellcheck", "-x", *files], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_it_defines_the_public_functions_and_only_private_helpers_besides() -> None:
    done = bash("declare -F | while read -r _ _ name; do echo $name; done")
    defined = set(done.stdout.decode().split())
    assert defined >= PUBLIC
    assert all(n.startswith("_flow_") for n in defined - PUBLIC)


def test_sourcing_it_twice_keeps_the_state_of_the_first(attempt: Path) -> None:
    done = run(attempt, 'flow_spawn; source "$FLOW_SH"; flow_wait main', FLOW_SH=str(FLOW_SH))
    assert done.returncode == 0, done.stderr
    assert outcome_json(attempt)["action"] == "wait"


def test_publishing_spawning_and_params_run_only_mkdir_mv_and_sync(
    tmp_path: Path, attempt: Path
) -> None:
    # a PATH holding nothing but these three commands: anything else would not be found
    only = tmp_path / "bin"
    only.mkdir()
    for cmd in ("mkdir", "mv", "sync"):
        found = shutil.which(cmd)
        assert found is not None
        os.symlink(found, only / cmd)
    script = """
        flow_steps main
        flow_param -v a a
        flow_param b default >/dev/null
        flow_spawn --tag t1 --param x="$a" --priority 3 --label one
        flow_spawn --step main
        flow_log "spawned two"
        flow_is_restart || flow_is_unclean_restart || flow_wait main --all-done
    """
    done = bash(
        script,
        env={**env_of(attempt), "PATH": str(only), "FLOW_PARAM_a": "1", "FLOW_DURABLE": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert b"command not found" not in done.stderr
    out = read_outcome(str(attempt))
    assert out is not None and out.action is Action.WAIT and len(out.children) == 2


def test_flow_succeed_takes_a_few_milliseconds(tmp_path: Path) -> None:
    n = 40
    for i in range(n):
        (tmp_path / f"a{i}").mkdir()
    script = f"""
        start=$EPOCHREALTIME
        for ((i = 0; i < {n}; i++)); do
            FLOW_CONTROL_DIR={tmp_path}/a$i
            _flow_published=0
            flow_succeed "call $i"
        done
        end=$EPOCHREALTIME
        echo $(( (${{end/[.,]/}} - ${{start/[.,]/}}) / {n} ))
    """
    done = bash(script)
    assert done.returncode == 0, done.stderr
    per_call_us = int(done.stdout)
    print(f"flow_succeed: {per_call_us} us per call")
    # no fork at all (outcome.line is written by bash itself); a generous bound so that a
    # loaded CI machine does not flake
    assert per_call_us < 50_000
    assert outcome_json(tmp_path / "a7") == {"action": "succeed", "message": "call 7"}


# -- outcomes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ("flow_succeed", {"action": "succeed", "message": ""}),
        ("flow_succeed all done", {"action": "succeed", "message": "all done"}),
        ("flow_fail 'bad input'", {"action": "fail", "message": "bad input"}),
        (
            "flow_fail 'bad input' bad_input",
            {"action": "fail", "message": "bad input", "code": "bad_input"},
        ),
        ("flow_advance two", {"action": "advance", "message": "", "step": "two"}),
        ("flow_advance two on we go", {"action": "advance", "message": "on we go", "step": "two"}),
        ("flow_retry 'disk full'", {"action": "retry", "message": "disk full"}),
        ("flow_pause 'needs a look'", {"action": "pause", "message": "needs a look"}),
    ],
)
def test_each_outcome_function_publishes_its_outcome(
    attempt: Path, call: str, expected: dict[str, object]
) -> None:
    done = run(attempt, call)
    assert done.returncode == 0, done.stderr
    assert outcome_json(attempt) == expected
    # written in place (protocol 2): one file, and nothing else in the attempt directory
    assert sorted(p.name for p in attempt.iterdir()) == ["outcome.line"]
    assert read_outcome(str(attempt)) is not None


def test_a_second_outcome_is_flagged_as_a_duplicate_and_returns_non_zero(attempt: Path) -> None:
    done = run(attempt, 'flow_succeed one; echo "rc=$?"; flow_fail two; echo "rc=$?"')
    assert done.stdout.decode().split() == ["rc=0", "rc=1"]
    assert b"already published an outcome" in done.stderr
    assert duplicate_note(attempt) == "fail\n"
    with pytest.raises(InvalidOutcome, match="more than one outcome"):
        read_outcome(str(attempt))


def test_an_outcome_published_by_a_subshell_counts_as_the_first(attempt: Path) -> None:
    done = run(attempt, "( flow_succeed from a subshell ); flow_advance two; echo rc=$?")
    assert done.stdout.decode().split() == ["rc=1"]
    assert duplicate_note(attempt) == "advance\n"


def test_functions_return_instead_of_exiting(attempt: Path) -> None:
    script = """
        flow_spawn --tag 'no spaces'; echo "spawn=$?"
        flow_param 'bad key'; echo "param=$?"
        flow_steps 9lives; echo "steps=$?"
        echo still here
    """
    done = run(attempt, script)
    assert done.stdout.decode().split() == ["spawn=2", "param=2", "steps=2", "still", "here"]


def test_outside_an_attempt_the_outcome_functions_say_how_to_run_the_program() -> None:
    done = bash('flow_succeed hi; echo "rc=$?"')
    assert done.stdout.decode().strip() == "rc=2"
    assert b"run this program through flow" in done.stderr


@pytest.mark.parametrize(
    ("call", "problem"),
    [
        ("flow_fail", "usage: flow_fail MSG [CODE]"),
        ("flow_fail oops 'no spaces'", "code 'no spaces' is not valid"),
        ("flow_advance", "usage: flow_advance STEP"),
        ("flow_advance 2nd", "step name '2nd' is not valid"),
        ("flow_retry", "usage: flow_retry REASON"),
        ("flow_pause", "usage: flow_pause REASON"),
        ("flow_wait", "usage: flow_wait STEP"),
        ("flow_spawn; flow_wait collect --sometimes", "unknown argument '--sometimes'"),
        ("flow_spawn; flow_wait collect --on-impossible", "--on-impossible needs a step"),
    ],
)
def test_misusing_an_outcome_function_publishes_a_fail_naming_the_problem(
    attempt: Path, call: str, problem: str
) -> None:
    done = run(attempt, f'{call}; echo "rc=$?"')
    assert done.stdout.decode().strip() == "rc=2"
    out = outcome_json(attempt)
    assert out["action"] == "fail" and out["code"] == "protocol_error"
    assert problem in str(out["message"]) and str(out["message"]).startswith("step main: flow_")
    assert problem in done.stderr.decode()


def test_advancing_to_an_undeclared_step_publishes_a_fail(attempt: Path) -> None:
    done = run(attempt, "flow_steps main two; flow_advance three")
    assert done.returncode == 2
    out = outcome_json(attempt)
    assert out["code"] == "protocol_error"
    assert out["message"] == (
        "step main: flow_advance: step 'three' is not declared with flow_steps (declared: main two)"
    )


def test_waiting_on_an_undeclared_step_publishes_a_fail(attempt: Path) -> None:
    run(attempt, "flow_steps main; flow_spawn; flow_wait collect")
    assert "step 'collect' is not declared" in str(outcome_json(attempt)["message"])


def test_a_join_over_no_children_publishes_a_fail(attempt: Path) -> None:
    done = run(attempt, "flow_wait collect")
    assert done.returncode == 2
    out = outcome_json(attempt)
    assert out["action"] == "fail" and out["code"] == "protocol_error"
    assert "no children were spawned" in str(out["message"])


def test_after_a_failed_spawn_the_next_outcome_becomes_a_fail_naming_it(attempt: Path) -> None:
    done = run(attempt, "flow_spawn --tag 'a b'; flow_spawn; flow_wait main")
    assert done.returncode == 2
    out = outcome_json(attempt)
    assert out["action"] == "fail"
    assert out["message"] == (
        "step main: flow_spawn: tag 'a b' is not valid (1-64 letters, digits, '_', '+' and "
        "'-', starting with a letter or digit)"
    )
    # a fail, published in place: no outcome.ready/, so no children.jsonl either
    assert sorted(p.name for p in attempt.iterdir()) == ["outcome.line"]


# -- children -------------------------------------------------------------------------------


def test_wait_publishes_the_join_and_one_line_per_child(attempt: Path, tmp_path: Path) -> None:
    prog = attempt / "bin" / "child.sh"
    prog.parent.mkdir()
    prog.write_text("#!/bin/sh\n")
    prog.chmod(0o755)
    script = """
        flow_spawn
        flow_spawn --tag part-2 --step main --param n=2 --param s='a "b"' --priority 7
        flow_spawn --label last.one --program bin/child.sh
        flow_spawn --label=eq --tag=t --param=k=v=w
        flow_wait collect --any-succeeded --on-impossible rescue
    """
    done = run(attempt, script)
    assert done.returncode == 0, done.stderr
    out = waiting_outcome(attempt, "collect", JoinMode.ANY_SUCCEEDED, "rescue")
    kids = {c.label: c for c in out.children}
    assert list(kids) == ["c1", "c2", "last.one", "eq"]
    assert kids["c1"].tag is None and kids["c1"].program is None and kids["c1"].params == {}
    assert kids["c2"].tag == "part-2" and kids["c2"].priority == 7
    assert kids["c2"].params == {"n": "2", "s": 'a "b"'}
    assert kids["last.one"].program == str(prog)
    assert kids["eq"].tag == "t" and kids["eq"].params == {"k": "v=w"}


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ("--tag 'a b'", "tag 'a b' is not valid"),
        ("--tag -x", "tag '-x' is not valid"),
        ("--tag " + "x" * 65, "is not valid"),
        ("--param 1x=2", "param key '1x' is not valid"),
        ("--param 'a-b=2'", "param key 'a-b' is not valid"),
        ("--param novalue", "--param needs KEY=VALUE"),
        ("--param a=1 --param a=2", "param 'a' is given twice"),
        ("--priority 1000", "priority '1000' is not an integer in 0-999"),
        ("--priority -1", "priority '-1' is not an integer in 0-999"),
        ("--label '.hidden'", "label '.hidden' is not valid"),
        ("--step 'no way'", "step name 'no way' is not valid"),
        ("--program does/not/exist", "is not an executable file"),
        ("--tag", "option --tag needs a value"),
        ("--colour red", "unknown argument '--colour'"),
    ],
)
def test_spawn_refuses_bad_arguments_with_a_message(attempt: Path, args: str, problem: str) -> None:
    done = run(attempt, f'flow_spawn {args}; echo "rc=$?"')
    assert done.stdout.decode().strip() == "rc=2"
    assert problem in done.stderr.decode()
    assert not (attempt / "outcome.ready").exists() and not (attempt / "outcome.line").exists()


def test_spawn_refuses_a_label_used_twice(attempt: Path) -> None:
    done = run(attempt, 'flow_spawn --label c2; flow_spawn; echo "rc=$?"')
    assert done.stdout.decode().strip() == "rc=2"
    assert b"label 'c2' is used twice" in done.stderr


def test_spawn_refuses_a_child_starting_at_an_undeclared_step(attempt: Path) -> None:
    done = run(attempt, 'flow_steps prepare collect; flow_spawn; echo "rc=$?"')
    assert done.stdout.decode().strip() == "rc=2"
    assert b"the child would start at step 'main', which is not declared" in done.stderr


def test_children_prints_the_children_file(attempt: Path) -> None:
    lines = "c1 0123 succeeded /ws/a dir/c1\nc2 4567 failed /ws/c2\n"
    (attempt / "children").write_text(lines)
    done = run(attempt, "flow_children")
    assert done.stdout.decode() == lines
    done = run(attempt, 'while read -r l i s p; do echo "$l|$s|$p"; done < <(flow_children)')
    assert done.stdout.decode() == "c1|succeeded|/ws/a dir/c1\nc2|failed|/ws/c2\n"


def test_children_without_a_join_says_where_they_exist(attempt: Path) -> None:
    done = run(attempt, 'flow_children; echo "rc=$?"')
    assert done.stdout.decode().strip() == "rc=1"
    assert b"the step that follows a flow_wait" in done.stderr


# -- context --------------------------------------------------------------------------------


def test_param_prints_the_value_exactly_or_the_default(attempt: Path) -> None:
    script = """
        flow_param a; echo "|"
        flow_param missing fallback; echo "|"
        flow_param -v v a; printf '<%s>' "$v"
        flow_param missing; echo "rc=$?"
    """
    done = run(attempt, script, FLOW_PARAM_a=" two words\n\n")
    assert done.stdout.decode() == " two words\n\n|\nfallback|\n< two words\n\n>rc=1\n"
    assert b"parameter missing is not set and no default was given" in done.stderr


def test_an_empty_param_is_set_and_wins_over_the_default(attempt: Path) -> None:
    done = run(attempt, "flow_param a x", FLOW_PARAM_a="")
    assert done.stdout == b""


@pytest.mark.parametrize(
    ("restart", "unclean", "expected"),
    [("0", "0", "no no"), ("1", "0", "yes no"), ("1", "1", "yes yes")],
)
def test_restart_predicates_follow_the_environment(
    attempt: Path, restart: str, unclean: str, expected: str
) -> None:
    script = """
        if flow_is_restart; then a=yes; else a=no; fi
        if flow_is_unclean_restart; then b=yes; else b=no; fi
        echo "$a $b"
    """
    done = run(attempt, script, FLOW_IS_RESTART=restart, FLOW_UNCLEAN_RESTART=unclean)
    assert done.stdout.decode().strip() == expected


def test_log_writes_a_timestamped_line_naming_step_and_attempt_to_stderr(attempt: Path) -> None:
    done = run(attempt, "flow_log hello   world", FLOW_ATTEMPT_ID="a0003")
    line = done.stderr.decode()
    assert done.stdout == b""
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d flow\[main a0003\]: hello world\n", line)


# -- flow_main ------------------------------------------------------------------------------

MAIN = """
flow_steps prepare compute
step_prepare() { flow_advance compute "prepared $*"; }
step_compute() {
    helper
}
helper() {
    echo computing
    false
    flow_succeed "not reached under set -e"
}
"""


def test_main_dispatches_the_step_with_the_program_arguments(attempt: Path) -> None:
    done = run(attempt, MAIN + 'flow_main "x y" z', FLOW_STEP="prepare")
    assert done.returncode == 0, done.stderr
    assert outcome_json(attempt) == {
        "action": "advance",
        "message": "prepared x y z",
        "step": "compute",
    }


def test_under_set_e_a_failing_command_fails_the_step_naming_command_and_line(
    attempt: Path,
) -> None:
    done = run(attempt, "set -e\n" + MAIN + "flow_main", FLOW_STEP="compute")
    assert done.returncode == 1
    out = outcome_json(attempt)
    # line 11 of the script: the source line comes first, then a blank line
    assert out == {
        "action": "fail",
        "message": "step compute: command `false` failed with status 1 at line 11 (in helper)",
        "code": "step_error",
    }


def test_without_set_e_a_failing_command_is_the_step_s_own_business(attempt: Path) -> None:
    done = run(attempt, MAIN + "flow_main", FLOW_STEP="compute")
    assert done.returncode == 0
    assert outcome_json(attempt)["message"] == "not reached under set -e"


def test_under_set_e_a_failing_subshell_fails_the_step_once(attempt: Path) -> None:
    script = "set -e\nflow_steps main\nstep_main() {\n  ( cd /nonexistent-dir )\n}\nflow_main"
    run(attempt, script)
    out = outcome_json(attempt)
    assert out["code"] == "step_error"
    assert out["message"] == (
        "step main: command `( cd /nonexistent-dir )` failed with status 1 at line 5"
    )
    assert duplicate_note(attempt) is None


def test_under_set_e_a_failing_pipeline_names_its_statuses(attempt: Path) -> None:
    script = "set -eo pipefail\nflow_steps main\nstep_main() {\n  false | true\n}\nflow_main"
    run(attempt, script)
    assert outcome_json(attempt)["message"] == (
        "step main: a pipeline failed with statuses 1 0 at line 5 (near `true`)"
    )


@pytest.mark.parametrize(
    "idiom",
    [
        "while read -r l; do :; done < <(false)",
        "{ false; } & wait",
        "x=$(false) || true",
        "if ! false | true; then :; fi",
        "( false ) || true",
        "local x=$(false)",
    ],
)
def test_under_set_e_failures_that_bash_ignores_do_not_end_the_step(
    attempt: Path, idiom: str
) -> None:
    script = (
        f"set -euo pipefail\nflow_steps main\nstep_main() {{\n  {idiom}\n  flow_succeed\n}}\n"
        "flow_main"
    )
    done = run(attempt, script)
    assert done.returncode == 0, done.stderr
    assert outcome_json(attempt) == {"action": "succeed", "message": ""}
    assert duplicate_note(attempt) is None


def test_under_set_e_a_step_returning_non_zero_fails_naming_the_step(attempt: Path) -> None:
    script = "set -e\nflow_steps main\nstep_main() { return 3; }\nflow_main"
    run(attempt, script)
    out = outcome_json(attempt)
    assert out["message"] == "step main: step_main returned status 3 without publishing an outcome"


def test_a_step_that_returns_without_an_outcome_fails_naming_it(attempt: Path) -> None:
    done = run(attempt, "flow_steps main\nstep_main() { :; }\nflow_main")
    assert done.returncode == 0
    out = outcome_json(attempt)
    assert out["code"] == "protocol_error"
    assert str(out["message"]).startswith(
        "step main: step_main returned (status 0) without publishing an outcome"
    )


def test_an_undeclared_step_fails_naming_it(attempt: Path) -> None:
    run(attempt, "flow_steps a b\nstep_a() { :; }\nflow_main", FLOW_STEP="c")
    out = outcome_json(attempt)
    assert out == {
        "action": "fail",
        "message": "step c: flow_main: step 'c' is not declared with flow_steps (declared: a b)",
        "code": "protocol_error",
    }


def test_a_declared_step_without_its_function_fails_naming_it(attempt: Path) -> None:
    run(attempt, "flow_steps a b\nstep_a() { :; }\nflow_main", FLOW_STEP="b")
    assert "no function step_b is defined" in str(outcome_json(attempt)["message"])


def test_main_without_declared_steps_says_to_declare_them(attempt: Path) -> None:
    run(attempt, "step_main() { flow_succeed; }\nflow_main")
    assert "no steps are declared; call flow_steps" in str(outcome_json(attempt)["message"])


def test_under_set_e_a_bad_spawn_fails_the_step_naming_the_problem(attempt: Path) -> None:
    script = """set -euo pipefail
flow_steps main
step_main() {
    flow_spawn --param 'bad key=1'
    flow_wait main
}
flow_main"""
    done = run(attempt, script)
    assert done.returncode != 0
    out = outcome_json(attempt)
    assert out["code"] == "protocol_error"
    assert out["message"] == (
        "step main: flow_spawn: param key 'bad key' is not valid "
        "(1-64 letters, digits and '_', not starting with a digit)"
    )


def test_without_set_e_an_ignored_bad_spawn_still_fails_the_step(attempt: Path) -> None:
    script = "flow_steps main\nstep_main() { flow_spawn --tag 'x y'; flow_succeed; }\nflow_main"
    run(attempt, script)
    out = outcome_json(attempt)
    assert out["action"] == "fail" and "tag 'x y' is not valid" in str(out["message"])


def test_set_u_and_pipefail_do_not_trip_over_the_api(attempt: Path) -> None:
    script = """set -euo pipefail
flow_steps main collect
step_main() {
    local x
    flow_param -v x x 1
    flow_spawn --step collect --param x="$x" | cat
    flow_spawn --step collect
    flow_is_restart || true
    flow_log "x=$x"
    flow_wait collect --all-succeeded
}
flow_main"""
    done = run(attempt, script)
    assert done.returncode == 0, done.stderr
    out = read_outcome(str(attempt))
    # the first spawn ran in a pipeline's subshell: it is lost, and so is its number
    assert out is not None and [(c.label, c.params) for c in out.children] == [("c1", {})]


def test_a_closed_stderr_never_fails_a_step_or_hides_a_misuse(attempt: Path) -> None:
    script = """set -euo pipefail
exec 2>&-
flow_steps main
step_main() {
    flow_log "nobody hears this"
    flow_spawn --tag 'a b'
    flow_wait main
}
flow_main"""
    run(attempt, script)
    out = outcome_json(attempt)
    assert out["code"] == "protocol_error"
    assert "flow_spawn: tag 'a b' is not valid" in str(out["message"])
