"""A manager SIGKILLed at any named crash point leaves work a second manager finishes,
committing every activation exactly once and registering every child exactly once."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from httk_flow.protocol import crash, names
from httk_flow.protocol.states import State

from .support import (
    FAMILY,
    THREE_STEPS,
    JobInfo,
    Managers,
    children_of,
    committed,
    dump,
    job,
    log_of,
    marker_keys,
    submit,
    write_script,
)

#: (point, nth hit) cases; the workload makes 45 transitions, 11 attempts and commits (5
#: in two renames: four advances and a wait whose commit registers 3 children; 6 direct
#: successes), so every nth here is reached by the first manager
CASES = [
    ("transition.after_journal", 1),
    ("transition.after_journal", 10),
    ("transition.after_journal", 30),
    ("transition.after_rename", 2),
    ("transition.after_rename", 15),
    ("transition.after_rename", 40),
    ("launch.after_spawn", 2),
    ("launch.after_spawn", 7),
    ("launch.after_running", 1),
    ("launch.after_running", 6),
    ("commit.after_committing", 2),
    ("commit.after_committing", 5),
    ("commit.after_children", 1),
    ("commit.after_tidy", 2),
    ("commit.after_tidy", 4),
    ("commit.after_final", 3),
    ("commit.after_final", 5),
    ("commit.after_direct", 1),
    ("commit.after_direct", 6),
    ("submit.after_payload", 2),
    ("submit.after_journal", 1),
    ("claim.after_claim", 1),
    ("claim.after_claim", 6),
    ("join.after_release", 1),
]
#: points covered elsewhere: a manager stopping its attempts (test_drain), the CLI's fence,
#: and operator requests (tests/ops/test_requests.py)
ELSEWHERE = {
    "cancel.after_signal",
    "cancel.after_fence",
    "request.after_claim",
    "request.after_apply",
    # counting an end into dependency sets and releasing: tests/manager/test_dependencies.py
    "after.before_count",
    "after.after_count",
    "after.after_decide",
    "after.before_released",
}

THREE_STEP_COMMITS = [(1, "main", "advance"), (2, "two", "advance"), (3, "three", "succeed")]
PARENT_COMMITS = [(1, "main", "wait"), (2, "collect", "succeed")]
CHILD_COMMITS = [(1, "child", "succeed")]


def real_commits(info: JobInfo) -> list[tuple[int, str, str]]:
    """Commits of attempts that ran to an end (an interrupted attempt is not charged)."""
    return [c for c in committed(info) if c[2] != "interrupted"]


def assert_exactly_once(root: str, singles: list[str], parent_id: str) -> None:
    for jid in singles:
        info = job(root, jid)
        assert info.state is State.SUCCEEDED, dump(root)
        assert real_commits(info) == THREE_STEP_COMMITS, dump(root, [jid])
    parent = job(root, parent_id)
    assert parent.state is State.SUCCEEDED, dump(root)
    assert real_commits(parent) == PARENT_COMMITS, dump(root, [parent_id])
    kids = children_of(root, parent)
    assert len(kids) == 3, dump(root)
    for kid in kids:
        assert kid.state is State.SUCCEEDED, dump(root)
        assert real_commits(kid) == CHILD_COMMITS, dump(root, [kid.handle.job_id])
    # every attempt is committed at most once, across every job
    for info in [job(root, j) for j in singles] + [parent, *kids]:
        attempt_ids = [f["attempt"]["id"] for f in info.commits()]
        assert len(attempt_ids) == len(set(attempt_ids)), dump(root, [info.handle.job_id])
    # one marker per job, and one payload directory per child
    assert set(marker_keys(root).values()) == {1}, marker_keys(root)
    assert len(marker_keys(root)) == len(singles) + 1 + 3
    parent_dir = parent.job_dir(root)
    payloads = [p for p in parent_dir.iterdir() if names.KEY_RE.fullmatch(p.name)]
    assert len(payloads) == 3


def test_the_cases_cover_every_crash_point_of_the_core() -> None:
    assert {p for p, _ in CASES} | ELSEWHERE == set(crash.POINTS)


@pytest.mark.parametrize(("point", "nth"), CASES, ids=[f"{p}:{n}" for p, n in CASES])
def test_a_manager_killed_at_a_crash_point_leaves_work_that_converges_exactly_once(
    root: str, scripts: Path, managers: Managers, point: str, nth: int
) -> None:
    singles = submit(root, write_script(scripts, "three.sh", THREE_STEPS), count=2)
    [parent] = submit(root, write_script(scripts, "family.sh", FAMILY), params={"kids": 3})
    first = managers.start(root, workers=3, env={"FLOW_CRASH_AT": f"{point}:{nth}"})
    rc = first.wait(60)
    assert rc == -signal.SIGKILL, f"the manager was not killed at {point}:{nth}\n{log_of(first)}"

    assert managers.run(root, workers=3) == 0
    assert_exactly_once(root, singles, parent)
