"""Every bash runner function through a real manager: jobs submitted with `flow submit`,
run by `flow run`, and read back from the journal.

All jobs of this module share one workspace and one manager run (a module fixture), so
each test below only reads what happened to its own job.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from httk_flow.protocol.states import State

from .support import Bench, Job

TOUR = r"""set -euo pipefail
flow_steps one two three fail fail_default retry pause family child collect \
    any alldone impossible rescue dependency

step_one() { flow_log "one here"; flow_advance two "one done"; }
step_two() { flow_advance three "$(flow_param greeting hello) from two"; }
step_three() { flow_succeed "done after three"; }

step_fail() { flow_fail "broken input" bad_input; }
step_fail_default() { flow_fail "just broken"; }

step_retry() {
    if flow_is_restart; then
        flow_succeed "restart of attempt $FLOW_ATTEMPT unclean=$FLOW_UNCLEAN_RESTART"
    else
        flow_retry "not yet"
    fi
}

step_pause() { flow_pause "look at me"; }

step_family() {
    # a relative --program is resolved against the current directory (the workdir)
    cp "$(flow_param child_program)" ./other.sh
    flow_spawn --tag kid-a --step child --param n=1 --priority 900
    flow_spawn --label second --step child --param n=2
    flow_spawn --label third --program other.sh --param n=3
    flow_wait collect --all-succeeded
}

step_child() {
    local n
    flow_param -v n n
    if [[ $(flow_param fail 0) == 1 ]]; then
        flow_fail "child $n fails on purpose" child_broke
        return
    fi
    printf '%s\n' "$((n * 10))" >"$FLOW_JOB_DIR/result"
    flow_succeed "child $n"
}

collect_into() {
    local label id state path v sum=0
    flow_children >"$FLOW_JOB_DIR/children.txt"
    while read -r label id state path; do
        if [[ $state == succeeded ]]; then
            read -r v <"$path/result"
            sum=$((sum + v))
        fi
    done < <(flow_children)
    flow_succeed "$1 $sum"
}

step_collect() { collect_into sum; }
step_rescue() { collect_into rescued; }

step_any() {
    flow_spawn --step child --param n=1 --param fail=1
    flow_spawn --step child --param n=2
    flow_wait collect --any-succeeded
}

step_alldone() {
    flow_spawn --step child --param n=1 --param fail=1
    flow_spawn --step child --param n=2
    flow_wait collect --all-done
}

step_impossible() {
    flow_spawn --step child --param n=1 --param fail=1
    flow_spawn --step child --param n=2
    flow_wait collect --all-succeeded --on-impossible rescue
}

step_dependency() {
    flow_spawn --label doomed --step child --param n=1 --param fail=1
    flow_wait collect
}

flow_main "$@"
"""

OTHER = r"""set -eu
flow_steps main
step_main() {
    printf '%s\n' "$(( $(flow_param n) * 100 ))" >"$FLOW_JOB_DIR/result"
    flow_succeed "other program"
}
flow_main
"""

MISUSE = r"""set -euo pipefail
flow_steps bad_tag bad_key no_children to_nowhere twice no_outcome failing_command
step_bad_tag() { flow_spawn --tag "not a tag"; flow_wait bad_tag; }
step_bad_key() { flow_spawn --param "bad-key=1"; flow_wait bad_key; }
step_no_children() { flow_wait bad_tag --all-done; }
step_to_nowhere() { flow_advance nowhere; }
step_twice() { flow_succeed first; flow_succeed second || true; }
step_no_outcome() { echo "forgot to say how it went"; }
step_failing_command() {
    ls /definitely/not/here
    flow_succeed "not reached"
}
flow_main "$@"
"""

CASES = [
    "one",
    "fail",
    "fail_default",
    "retry",
    "pause",
    "family",
    "any",
    "alldone",
    "impossible",
    "dependency",
]
MISUSES = [
    "bad_tag",
    "bad_key",
    "no_children",
    "to_nowhere",
    "twice",
    "no_outcome",
    "failing_command",
    "undeclared",
]


@dataclass
class Tour:
    bench: Bench
    ids: dict[str, str]
    rc: int

    def job(self, case: str) -> Job:
        return self.bench.job(self.ids[case])


@pytest.fixture(scope="module")
def tour(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tour]:
    bench = Bench(tmp_path_factory.mktemp("tour"))
    prog = bench.script("tour.sh", TOUR)
    other = bench.script("other.sh", OTHER)
    misuse = bench.script("misuse.sh", MISUSE)
    lines = [
        {
            "step": c,
            "params": {"child_program": other, "greeting": "hi"},
            "tag": c.replace("_", "-"),
        }
        for c in CASES
    ]
    ids = dict(zip(CASES, bench.submit_many(prog, lines), strict=True))
    bad = [{"step": "nosuch" if c == "undeclared" else c} for c in MISUSES]
    ids.update(zip(MISUSES, bench.submit_many(misuse, bad), strict=True))
    rc = bench.run(workers=4)
    yield Tour(bench, ids, rc)
    bench.close()


def test_flow_run_reports_that_some_jobs_failed(tour: Tour) -> None:
    assert tour.rc == 1


def test_advance_runs_the_steps_in_order_with_params_and_messages(tour: Tour) -> None:
    job = tour.job("one")
    assert job.state is State.SUCCEEDED, job.describe()
    assert job.message == "done after three"
    commits = job.commits()
    assert [(f["to"], f.get("step"), f.get("message")) for f in commits] == [
        ("ready", "two", "one done"),
        ("ready", "three", "hi from two"),
        ("succeeded", "three", "done after three"),
    ]


def test_log_lines_land_in_the_attempt_stderr(tour: Tour) -> None:
    assert "flow[one a0001]: one here" in tour.job("one").stderr()


def test_fail_records_the_message_and_the_code(tour: Tour) -> None:
    job = tour.job("fail")
    assert (job.state, job.code, job.reason) == (State.FAILED, "bad_input", "broken input")


def test_fail_without_a_code_records_failed(tour: Tour) -> None:
    job = tour.job("fail_default")
    assert (job.state, job.code, job.reason) == (State.FAILED, "failed", "just broken")


def test_retry_runs_the_step_again_as_a_restart(tour: Tour) -> None:
    job = tour.job("retry")
    assert job.state is State.SUCCEEDED, job.describe()
    assert job.message == "restart of attempt 2 unclean=0"
    assert [f["why"] for f in job.commits()] == ["retry requested: not yet", "succeed"]


def test_pause_parks_the_job_with_its_reason(tour: Tour) -> None:
    job = tour.job("pause")
    assert (job.state, job.message) == (State.PAUSED, "look at me")


def test_spawn_and_wait_run_the_children_and_continue_after_the_join(tour: Tour) -> None:
    job = tour.job("family")
    assert job.state is State.SUCCEEDED, job.describe()
    # children 1 and 2 ran step `child` of this program, 3 ran other.sh
    assert job.message == "sum 330"
    rows = [line.split(" ", 3) for line in (job.dir / "children.txt").read_text().splitlines()]
    assert [(r[0], r[2]) for r in rows] == [
        ("c1", "succeeded"),
        ("second", "succeeded"),
        ("third", "succeeded"),
    ]
    for label, cid, _, path in rows:
        child = tour.bench.job(cid)
        assert Path(path) == child.dir and (child.dir / "result").exists()
        assert len(child.commits()) == 1
        assert child.handle.key == (f"kid-a--{cid}" if label == "c1" else cid)
    assert tour.bench.job(rows[0][1]).handle.marker.priority == 900


def test_any_succeeded_continues_once_one_child_succeeded(tour: Tour) -> None:
    job = tour.job("any")
    assert job.state is State.SUCCEEDED, job.describe()
    assert job.message == "sum 20"


def test_all_done_continues_whatever_the_children_ended(tour: Tour) -> None:
    job = tour.job("alldone")
    assert job.state is State.SUCCEEDED, job.describe()
    states = [line.split()[2] for line in (job.dir / "children.txt").read_text().splitlines()]
    assert states == ["failed", "succeeded"]


def test_on_impossible_continues_at_the_rescue_step(tour: Tour) -> None:
    job = tour.job("impossible")
    assert job.state is State.SUCCEEDED, job.describe()
    assert job.message is not None and job.message.startswith("rescued")


def test_a_failed_child_fails_an_all_succeeded_join(tour: Tour) -> None:
    job = tour.job("dependency")
    assert (job.state, job.code) == (State.FAILED, "dependency_failure"), job.describe()
    assert "doomed (failed)" in job.reason


# -- misuse ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "code", "reason"),
    [
        (
            "bad_tag",
            "protocol_error",
            "step bad_tag: flow_spawn: tag 'not a tag' is not valid (1-64 letters, digits, "
            "'_', '+' and '-', starting with a letter or digit)",
        ),
        (
            "bad_key",
            "protocol_error",
            "step bad_key: flow_spawn: param key 'bad-key' is not valid (1-64 letters, digits "
            "and '_', not starting with a digit)",
        ),
        (
            "no_children",
            "protocol_error",
            "step no_children: flow_wait: no children were spawned: a join over nothing can "
            "never be decided; call flow_spawn before flow_wait",
        ),
        (
            "to_nowhere",
            "protocol_error",
            "step to_nowhere: flow_advance: step 'nowhere' is not declared with flow_steps "
            "(declared: bad_tag bad_key no_children to_nowhere twice no_outcome "
            "failing_command)",
        ),
        (
            "twice",
            "protocol_error",
            "the attempt published more than one outcome: succeed ('first'), then succeed; "
            "publishing an outcome does not end the step, so return (or exit) right after it",
        ),
        (
            "no_outcome",
            "protocol_error",
            "step no_outcome: step_no_outcome returned (status 0) without publishing an "
            "outcome; end each step with flow_succeed, flow_fail, flow_advance, flow_wait, "
            "flow_retry or flow_pause",
        ),
        (
            "failing_command",
            "step_error",
            "step failing_command: command `ls /definitely/not/here` failed with status 2 "
            "at line 12",  # line 10 of MISUSE, after the two lines of the prelude
        ),
        (
            "undeclared",
            "protocol_error",
            "step nosuch: flow_main: step 'nosuch' is not declared with flow_steps",
        ),
    ],
)
def test_misuse_fails_the_job_with_a_clear_reason(
    tour: Tour, case: str, code: str, reason: str
) -> None:
    job = tour.job(case)
    assert job.state is State.FAILED, job.describe()
    assert job.code == code
    assert reason in job.reason
    # a misuse is the program's bug: failing at once, never retried
    assert len(job.commits()) == 1
