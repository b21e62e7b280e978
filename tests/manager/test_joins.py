"""A parent spawns children through its outcome, waits on their join, and resumes."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from httk_flow.protocol.states import State

from .support import FAMILY, JobInfo, Managers, children_of, dump, job, submit, write_script


def run_family(
    root: str, scripts: Path, managers: Managers, exit_status: int, **params: object
) -> JobInfo:
    """Submit one FAMILY parent with `params` and run a manager to idle (it must exit with
    `exit_status`: 1 when a job it ran failed); the parent, afterwards."""
    [pid] = submit(root, write_script(scripts, "family.sh", FAMILY), params=params)
    assert managers.run(root) == exit_status
    return job(root, pid)


def children_file(root: str, parent: JobInfo, step: str) -> list[list[str]]:
    """The `children` file the attempt of `step` was given, split into fields per line."""
    [att] = [a for a in parent.attempts if a["step"] == step]
    return [line.split(" ") for line in (Path(att["dir"]) / "children").read_text().splitlines()]


def test_a_parent_resumes_at_its_join_step_with_every_child_listed(
    root: str, scripts: Path, managers: Managers
) -> None:
    parent = run_family(root, scripts, managers, 0, kids=5)
    assert parent.state is State.SUCCEEDED, dump(root)
    assert [a["step"] for a in parent.attempts] == ["main", "collect"]
    kids = children_of(root, parent)
    assert len(kids) == 5
    assert {k.state for k in kids} == {State.SUCCEEDED}
    lines = children_file(root, parent, "collect")
    assert sorted(f[0] for f in lines) == ["c1", "c2", "c3", "c4", "c5"]
    for label, cid, state, path in lines:
        [kid] = [k for k in kids if k.handle.job_id == cid]
        assert state == "succeeded"
        assert Path(path) == kid.job_dir(root)
        spec = orjson.loads((Path(path) / "job.json").read_bytes())
        assert label == f"c{spec['params']['n']}"


def test_a_failed_child_fails_its_parent_with_dependency_failure(
    root: str, scripts: Path, managers: Managers
) -> None:
    # 1: the child it ran failed
    parent = run_family(root, scripts, managers, 1, kids=3, bad=2)
    assert parent.state is State.FAILED, dump(root)
    assert parent.failure_code == "dependency_failure"
    assert "c2" in parent.last["failure"]["message"]
    assert [a["step"] for a in parent.attempts] == ["main"]
    kids = {k.handle.job_id: k for k in children_of(root, parent)}
    assert len(kids) == 3
    failed = [k for k in kids.values() if k.state is State.FAILED]
    assert [k.failure_code for k in failed] == ["child_broke"]


def test_an_impossible_join_resumes_the_parent_at_its_on_impossible_step(
    root: str, scripts: Path, managers: Managers
) -> None:
    # 1: the child it ran failed
    parent = run_family(root, scripts, managers, 1, kids=3, bad=1, rescue="rescue")
    assert parent.state is State.SUCCEEDED, dump(root)
    assert [a["step"] for a in parent.attempts] == ["main", "rescue"]
    resumed = next(f for f in parent.frames if f.get("from") == "waiting")
    assert resumed["why"] == "join impossible"
    assert resumed["step"] == "rescue"
    lines = children_file(root, parent, "rescue")
    assert [f[2] for f in lines if f[0] == "c1"] == ["failed"]
    assert len(lines) == 3


def test_a_retried_join_step_still_sees_its_children(
    root: str, scripts: Path, managers: Managers
) -> None:
    parent = run_family(root, scripts, managers, 0, kids=2, flaky_collect=1)
    assert parent.state is State.SUCCEEDED, dump(root)
    seen = sorted((parent.job_dir(root) / "run").glob("children.collect.*"))
    assert len(seen) == 2
    for path in seen:
        assert [line.split(" ")[0] for line in path.read_text().splitlines()] == ["c1", "c2"]


@pytest.mark.parametrize("mode", ["all_done", "any_succeeded"])
def test_a_join_that_tolerates_a_failed_child_resumes_its_parent(
    root: str, scripts: Path, managers: Managers, mode: str
) -> None:
    # 1: the child it ran failed
    parent = run_family(root, scripts, managers, 1, kids=3, bad=2, join=mode)
    assert parent.state is State.SUCCEEDED, dump(root)
    assert [a["step"] for a in parent.attempts] == ["main", "collect"]
    resumed = next(f for f in parent.frames if f.get("from") == "waiting")
    assert resumed["why"] == "joined"
    lines = {f[0]: f[2] for f in children_file(root, parent, "collect")}
    assert set(lines) == {"c1", "c2", "c3"}
    if mode == "all_done":
        assert lines == {"c1": "succeeded", "c2": "failed", "c3": "succeeded"}
    else:
        assert "succeeded" in lines.values()
