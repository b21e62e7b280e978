"""What a manager makes of an ended attempt: steps, retries, backoff and every outcome action."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from httk_flow.protocol.states import State

from .support import (
    THREE_STEPS,
    JobInfo,
    Managers,
    committed,
    dump,
    job,
    make_workspace,
    marker_keys,
    submit,
    write_script,
)

#: fails its first attempt, noting "$FLOW_ATTEMPT $FLOW_IS_RESTART" at each start
FAILS_ONCE = """
echo "$FLOW_ATTEMPT $FLOW_IS_RESTART" >> "$FLOW_WORKDIR/seen"
[ "$(bump main)" -eq 1 ] && exit 1
publish '{"action":"succeed"}'
"""

#: fails its first attempt, noting the time of each start
FAILS_ONCE_TIMED = """
date +%s.%N >> "$FLOW_WORKDIR/starts"
[ "$(bump main)" -eq 1 ] && exit 1
exit 0
"""

#: asks for a retry at its first attempt, then succeeds
RETRIES_ONCE = """
if [ "$(bump main)" -eq 1 ]; then
    publish '{"action":"retry","message":"not yet"}'
else
    publish '{"action":"succeed"}'
fi
"""

#: the first attempt of each step fails; main advances to two, two succeeds
EACH_STEP_FAILS_ONCE = """
[ "$(bump "$FLOW_STEP")" -eq 1 ] && exit 1
case "$FLOW_STEP" in
    main) publish '{"action":"advance","step":"two"}' ;;
    two) publish '{"action":"succeed"}' ;;
esac
"""


def run_one(
    root: str, scripts: Path, managers: Managers, exit_status: int, body: str, **fields: Any
) -> JobInfo:
    """Submit one job running `body` with `fields` and run a manager to idle (it must exit
    with `exit_status`: 1 when a job it ran failed); the job, afterwards."""
    [jid] = submit(root, write_script(scripts, "job.sh", body), **fields)
    assert managers.run(root) == exit_status
    return job(root, jid)


def test_a_three_step_job_advances_through_every_step(
    root: str, scripts: Path, managers: Managers
) -> None:
    info = run_one(root, scripts, managers, 0, THREE_STEPS)
    assert info.state is State.SUCCEEDED, dump(root)
    assert committed(info) == [
        (1, "main", "advance"),
        (2, "two", "advance"),
        (3, "three", "succeed"),
    ]
    assert [a["step"] for a in info.attempts] == ["main", "two", "three"]
    assert info.last["step"] == "three"
    assert info.last.get("message") == "done"


def test_a_job_that_fails_once_is_retried_and_succeeds(
    root: str, scripts: Path, managers: Managers
) -> None:
    info = run_one(root, scripts, managers, 0, FAILS_ONCE)
    assert info.state is State.SUCCEEDED, dump(root)
    assert len(info.attempts) == 2
    assert [why for _, _, why in committed(info)] == ["process failure: exit status 1", "succeed"]
    seen = (info.job_dir(root) / "run" / "seen").read_text().split("\n")
    assert seen[:2] == ["1 0", "2 1"]


def test_a_job_that_always_fails_exhausts_its_retry_budget(
    root: str, scripts: Path, managers: Managers
) -> None:
    info = run_one(root, scripts, managers, 1, "exit 1\n", retries=1)
    assert info.state is State.FAILED, dump(root)
    assert info.failure_code == "budget_exhausted"
    assert info.last["failure"]["retryable"] is True
    assert len(info.attempts) == 2


def test_a_retry_does_not_start_before_its_backoff_has_passed(
    tmp_path: Path, scripts: Path, managers: Managers
) -> None:
    root = make_workspace(tmp_path / "slow-ws", backoff_base=1.0)
    info = run_one(root, scripts, managers, 0, FAILS_ONCE_TIMED)
    assert info.state is State.SUCCEEDED, dump(root)
    first = next(f for f in info.frames if f.get("to") == "committing")
    not_before = first["decision"]["not_before"]
    assert not_before >= first["t"] + 1.0
    starts = [float(s) for s in (info.job_dir(root) / "run" / "starts").read_text().split()]
    assert len(starts) == 2
    assert starts[1] >= not_before
    second_claim = [f for f in info.frames if f.get("to") == "claimed"][1]
    assert second_claim["t"] >= not_before


def test_a_pause_outcome_leaves_the_job_paused(
    root: str, scripts: Path, managers: Managers
) -> None:
    pause = """publish '{"action":"pause","message":"look"}'\n"""
    info = run_one(root, scripts, managers, 4, pause)  # stopped with paused work left
    assert info.state is State.PAUSED, dump(root)
    assert info.last["why"] == "pause"
    assert info.last["message"] == "look"


def test_a_fail_outcome_fails_the_job_with_its_code_and_no_retry(
    root: str, scripts: Path, managers: Managers
) -> None:
    fail = """publish '{"action":"fail","code":"bad_input","message":"no"}'\n"""
    info = run_one(root, scripts, managers, 1, fail, retries=3)
    assert info.state is State.FAILED, dump(root)
    assert info.failure_code == "bad_input"
    assert info.last["failure"]["message"] == "no"
    assert len(info.attempts) == 1


def test_exit_0_without_an_outcome_fails_a_job_that_requires_one(
    root: str, scripts: Path, managers: Managers
) -> None:
    program = write_script(scripts, "silent.sh", "exit 0\n")
    [strict] = submit(root, program, require_outcome=True)
    [lax] = submit(root, program)
    assert managers.run(root) == 1
    info = job(root, strict)
    assert info.state is State.FAILED, dump(root)
    assert info.failure_code == "protocol_error"
    assert len(info.attempts) == 1
    assert job(root, lax).state is State.SUCCEEDED


#: each way an attempt can publish a bad outcome, chosen by $FLOW_PARAM_kind
BROKEN = r"""
d="${FLOW_CONTROL_DIR:?not inside an attempt}/outcome.tmp.$$"
mkdir "$d"
case "$FLOW_PARAM_kind" in
    json) echo '{"action": "succeed",' > "$d/outcome.json" ;;
    action) echo '{"action": "explode"}' > "$d/outcome.json" ;;
    no_step) echo '{"action": "advance"}' > "$d/outcome.json" ;;
    bad_step) echo '{"action": "advance", "step": "../x"}' > "$d/outcome.json" ;;
    no_children) echo '{"action": "wait", "step": "collect"}' > "$d/outcome.json" ;;
    bad_child) echo '{"action": "wait", "step": "collect"}' > "$d/outcome.json"
               echo '{"label": "../escape"}' > "$d/children.jsonl" ;;
    empty) ;;
    file) rmdir "$d"; echo '{"action": "succeed"}' > "$d" ;;
esac
mv "$d" "$FLOW_CONTROL_DIR/outcome.ready"
"""
KINDS = ["json", "action", "no_step", "bad_step", "no_children", "bad_child", "empty", "file"]


def test_a_malformed_outcome_fails_its_job_alone_with_a_protocol_error(
    root: str, scripts: Path, managers: Managers
) -> None:
    broken = write_script(scripts, "broken.sh", BROKEN)
    bad = {kind: submit(root, broken, params={"kind": kind}, retries=3)[0] for kind in KINDS}
    good = submit(
        root, write_script(scripts, "good.sh", """publish '{"action":"succeed"}'\n"""), count=4
    )
    assert managers.run(root) == 1
    for kind, jid in bad.items():
        info = job(root, jid)
        assert info.state is State.FAILED, f"{kind}: {dump(root, [jid])}"
        assert info.failure_code == "protocol_error", kind
        assert len(info.attempts) == 1, kind
    assert Counter(job(root, j).state for j in good) == {State.SUCCEEDED: 4}
    assert set(marker_keys(root).values()) == {1}


def test_a_retry_outcome_is_charged_and_backs_off(
    root: str, scripts: Path, managers: Managers
) -> None:
    [once] = submit(root, write_script(scripts, "retry.sh", RETRIES_ONCE))
    [never] = submit(
        root, write_script(scripts, "again.sh", """publish '{"action":"retry"}'\n"""), retries=1
    )
    assert managers.run(root) == 1
    info = job(root, once)
    assert info.state is State.SUCCEEDED, dump(root)
    first = committed(info)[0]
    assert first[2] == "retry requested: not yet"
    retry_commit = next(f for f in info.frames if f.get("to") == "committing")
    assert retry_commit["decision"]["not_before"] > 0
    info = job(root, never)
    assert info.state is State.FAILED, dump(root)
    assert info.failure_code == "budget_exhausted"
    assert len(info.attempts) == 2


def test_every_activation_has_its_own_retry_budget(
    root: str, scripts: Path, managers: Managers
) -> None:
    info = run_one(root, scripts, managers, 0, EACH_STEP_FAILS_ONCE, retries=1)
    assert info.state is State.SUCCEEDED, dump(root)
    assert [(act, step) for act, step, _ in committed(info)] == [
        (1, "main"),
        (1, "main"),
        (2, "two"),
        (2, "two"),
    ]


def test_the_max_attempts_budget_spans_the_whole_job(
    root: str, scripts: Path, managers: Managers
) -> None:
    info = run_one(root, scripts, managers, 1, "exit 1\n", retries=5, max_attempts=2)
    assert info.state is State.FAILED, dump(root)
    assert info.failure_code == "budget_exhausted"
    assert "max_attempts" in info.last["failure"]["message"]
    assert len(info.attempts) == 2
