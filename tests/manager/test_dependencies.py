"""`--after`: chains and diamonds run by several managers that are killed while they run,
each dependent committed exactly once and started only after what it waits for ended;
the policies for a dependency that does not succeed; a manager killed at every step of
counting an end or releasing a set, and the next one finishing the work."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from httk_flow.ops.depend import prepare
from httk_flow.protocol.after import AfterPolicy
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.workspace import Workspace

from .support import (
    JobInfo,
    Managers,
    all_jobs,
    dump,
    flow,
    leased_workspace,
    marker_keys,
    write_script,
)

#: sleeps a little, so kills land while jobs run; `fail=1` makes it fail
WORK = r"""
sleep "0.$(( RANDOM % 3 + 1 ))"
[ "${FLOW_PARAM_fail:-0}" = 1 ] && exit 3
exit 0
"""


def _submit(
    root: str,
    program: str,
    tag: str,
    count: int = 1,
    after: tuple[str, ...] = (),
    policy: AfterPolicy = AfterPolicy.OK,
    **params: str | int,
) -> list[str]:
    ws = Workspace.open(root)
    try:
        deps = prepare(ws, after, policy, actor="test").after if after else ()
        reqs = [
            SubmitRequest(program=program, tag=tag, after=deps, params=dict(params), retries=0)
            for _ in range(count)
        ]
        return [s.id for s in Submitter(ws, actor="test").submit(reqs)]
    finally:
        ws.close()


def _first_start(info: JobInfo) -> float | None:
    starts = [float(f["t"]) for f in info.frames if f.get("to") == State.RUNNING.value]
    return min(starts) if starts else None


def _end(info: JobInfo) -> float:
    """When it last ended (a failed job that is resumed ends again)."""
    return max(float(f["t"]) for f in info.frames if State(f["to"]).is_terminal)


def _by_tag(infos: list[JobInfo]) -> dict[str, list[JobInfo]]:
    out: dict[str, list[JobInfo]] = {}
    for i in infos:
        out.setdefault(i.handle.marker.tag or "-", []).append(i)
    return out


def _kill_and_replace(root: str, managers: Managers, n: int, kills: int, seed: int) -> int:
    """Run `n` managers; kill -9 one at random every so often (`kills` times), starting
    another each time; then let them finish. Returns how many kills landed."""
    rng = random.Random(seed)
    live = [managers.start(root, command="serve", workers=2) for _ in range(n)]
    landed = 0
    for _ in range(kills):
        time.sleep(rng.uniform(0.6, 1.4))
        victim = live.pop(rng.randrange(len(live)))
        if victim.poll() is None:
            os.kill(victim.pid, signal.SIGKILL)
            landed += 1
        victim.wait()
        live.append(managers.start(root, command="serve", workers=2))
    return landed


def _wait_all_ended(root: str, total: int, timeout: float) -> list[JobInfo]:
    deadline = time.monotonic() + timeout
    while True:
        infos = all_jobs(root)
        if len(infos) == total and all(i.state.is_terminal for i in infos):
            return infos
        if time.monotonic() > deadline:
            raise AssertionError(f"not every job ended in {timeout} s:\n{dump(root)}")
        time.sleep(0.3)


def test_chains_and_diamonds_across_three_killed_managers_commit_each_dependent_once_in_order(
    tmp_path: Path, managers: Managers
) -> None:
    root = leased_workspace(tmp_path / "ws", "1s")
    prog = write_script(tmp_path / "scripts", "work.sh", WORK)
    _submit(root, prog, "a", 4)
    _submit(root, prog, "b1", 3, after=("tag:a",))
    _submit(root, prog, "b2", 2, after=("tag:a",))
    _submit(root, prog, "c", 2, after=("tag:b1", "tag:b2"))  # the diamond's foot
    [d1] = _submit(root, prog, "d1", after=("tag:c",))
    [d2] = _submit(root, prog, "d2", after=(d1,))
    _submit(root, prog, "d3", after=(d2,))
    # a dependency that fails, and one dependent per policy
    [bad] = _submit(root, prog, "bad", fail=1)
    _submit(root, prog, "ok", after=(bad,))
    _submit(root, prog, "any", after=(bad,), policy=AfterPolicy.ANY)
    _submit(root, prog, "fail", after=(bad,), policy=AfterPolicy.FAIL)
    _submit(root, prog, "late", after=("tag:c", bad), policy=AfterPolicy.FAIL)
    total = 4 + 3 + 2 + 2 + 3 + 1 + 4

    # kills far enough apart that no job sees three managers die under it in a row (it
    # would fail with manager_deaths, by design, and cancel what waits for it)
    landed = _kill_and_replace(root, managers, 3, kills=6, seed=17)
    infos = _wait_all_ended(root, total, timeout=180)
    assert landed >= 4
    assert set(marker_keys(root).values()) == {1}, "a job has two markers"
    tags = _by_tag(infos)
    ends = {t: [_end(i) for i in js] for t, js in tags.items()}

    def check_after(tag: str, deps: tuple[str, ...]) -> None:
        for i in tags[tag]:
            assert i.state is State.SUCCEEDED, dump(root)
            commits = [f for f in i.frames if f.get("to") == State.SUCCEEDED.value]
            assert len(commits) == 1
            start = _first_start(i)
            assert start is not None
            latest = max(e for d in deps for e in ends[d])
            assert start >= latest, f"{tag} started before {deps} ended:\n{dump(root)}"

    assert {i.state for i in tags["a"]} == {State.SUCCEEDED}
    check_after("b1", ("a",))
    check_after("b2", ("a",))
    check_after("c", ("b1", "b2"))
    check_after("d1", ("c",))
    check_after("d2", ("d1",))
    check_after("d3", ("d2",))
    assert [i.state for i in tags["bad"]] == [State.FAILED]
    [ok] = tags["ok"]
    assert ok.state is State.CANCELLED and _first_start(ok) is None
    assert "dependency bad--" in str(ok.last.get("reason")), dump(root)
    check_after("any", ("bad",))
    [failed] = tags["fail"]
    assert failed.state is State.FAILED and _first_start(failed) is None
    assert failed.failure_code == "dependency_failure"
    [late] = tags["late"]
    # a broken set decides at once, while the other set it waits for is still open
    assert late.state is State.FAILED and _first_start(late) is None


#: fails the first time it runs, succeeds when run again (after `flow resume`)
FLAKY = r"""
if [ ! -e "$FLOW_WORKSPACE_DIR/flaky.ran" ]; then touch "$FLOW_WORKSPACE_DIR/flaky.ran"; exit 3; fi
exit 0
"""


def test_policy_wait_keeps_a_dependent_waiting_until_its_failed_dependency_is_resumed(
    tmp_path: Path, managers: Managers
) -> None:
    root = leased_workspace(tmp_path / "ws", "1s")
    flaky = write_script(tmp_path / "scripts", "flaky.sh", FLAKY)
    prog = write_script(tmp_path / "scripts", "work.sh", "exit 0\n")
    [first] = _submit(root, flaky, "first")
    [second] = _submit(root, prog, "second", after=(first,), policy=AfterPolicy.WAIT)
    assert managers.run(root) == 1  # the job it ran failed
    infos = {i.handle.job_id: i for i in all_jobs(root)}
    assert infos[first].state is State.FAILED
    assert infos[second].state is State.WAITING, dump(root)
    assert infos[second].handle.marker.after
    assert infos[second].last.get("why") == "after"
    shown = flow("show", "-w", root, second)
    assert f"{first} (wait): 0 of 1 ended" in shown.stdout, shown.stdout
    r = flow("resume", "-w", root, first)
    assert r.returncode == 0, r.stderr
    assert managers.run(root) == 0, dump(root)
    infos = {i.handle.job_id: i for i in all_jobs(root)}
    assert infos[first].state is State.SUCCEEDED
    assert infos[second].state is State.SUCCEEDED, dump(root)
    assert _first_start(infos[second]) >= _end(infos[first])  # type: ignore[operator]


@pytest.mark.parametrize(
    "point",
    ["after.before_count", "after.after_count", "after.after_decide", "after.before_released"],
)
def test_a_manager_killed_while_counting_an_end_or_releasing_leaves_work_the_next_one_finishes(
    tmp_path: Path, managers: Managers, point: str
) -> None:
    root = leased_workspace(tmp_path / "ws", "1s")
    prog = write_script(tmp_path / "scripts", "work.sh", "exit 0\n")
    [first] = _submit(root, prog, "first")
    deps = _submit(root, prog, "dep", 3, after=(first,))
    crashed = managers.start(root, command="run", env={"FLOW_CRASH_AT": point})
    crashed.wait(60)
    assert crashed.returncode == -signal.SIGKILL, f"{point} was not reached"
    assert managers.run(root, timeout=90) == 0, dump(root)
    infos = {i.handle.job_id: i for i in all_jobs(root)}
    assert infos[first].state is State.SUCCEEDED
    for d in deps:
        assert infos[d].state is State.SUCCEEDED, dump(root)
        assert len([f for f in infos[d].frames if f.get("to") == "succeeded"]) == 1
        start = _first_start(infos[d])
        assert start is not None and start >= _end(infos[first])
    assert not list((Path(root) / ".flow" / "watch").iterdir())
