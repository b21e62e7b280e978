"""Dependency sets under the interleavings a review found (protocol.md §14): a breaking
end racing the last count, a pause before registration, a batch whose first submitter
died before watching its members, gc of a set a dependent still reads, a resume racing
a release. Each scene is played in one process at the exact point, with real files."""

from __future__ import annotations

import time

from httk_flow.ops import steering
from httk_flow.ops.depend import _set_id, prepare
from httk_flow.ops.gc import collect
from httk_flow.ops.select import resolve_after
from httk_flow.protocol import fsio
from httk_flow.protocol import release as rel
from httk_flow.protocol.after import AfterPolicy, DependencySets
from httk_flow.protocol.handles import JobHandle
from httk_flow.protocol.jobs import current_frame, fail, register
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.transition import locate_key, transition
from httk_flow.protocol.workspace import Workspace


def _submit(
    ws: Workspace,
    tag: str,
    *,
    after: tuple[str, ...] = (),
    seed: str | None = None,
    n: int = 1,
    placement: str | None = None,
) -> list[JobHandle]:
    deps = prepare(ws, after, AfterPolicy.OK, actor="t", seed=seed).after if after else ()
    reqs = [
        SubmitRequest(program="true", tag=tag, after=deps, retries=0, placement=placement)
        for _ in range(n)
    ]
    return [_find(ws, s.placement, s.key) for s in Submitter(ws, actor="t").submit(reqs)]


def _find(ws: Workspace, placement: str, key: str) -> JobHandle:
    h = locate_key(ws, placement, key)
    assert h is not None
    return h


def _now(ws: Workspace, h: JobHandle) -> JobHandle:
    return _find(ws, h.placement, h.key)


def _reg(ws: Workspace, h: JobHandle) -> JobHandle:
    return register(ws, h, actor="mgr")


def _succeed(ws: Workspace, h: JobHandle) -> None:
    body = current_frame(ws, h).body
    for st in (State.CLAIMED, State.RUNNING, State.COMMITTING, State.SUCCEEDED):
        h = transition(ws, h, st, body.carry(), actor="mgr")


def test_a_failure_counted_while_another_end_completes_the_set_still_cancels(
    ws: Workspace,
) -> None:
    a, b = (_reg(ws, h) for h in _submit(ws, "dep", n=2))
    [d] = [_reg(ws, h) for h in _submit(ws, "child", after=("tag:dep",))]
    real = rel.crash_point
    fired: list[int] = []

    def between(name: str) -> None:
        # B succeeds (another manager) right after A's failure was counted
        if name == "after.after_count" and not fired:
            fired.append(1)
            queue, ws.ends_queue = ws.ends_queue, None
            try:
                _succeed(ws, _now(ws, b))
            finally:
                ws.ends_queue = queue
        real(name)

    rel.crash_point = between  # type: ignore[assignment]
    try:
        fail(ws, a, current_frame(ws, a), "exit", "boom", actor="mgr")
    finally:
        rel.crash_point = real
    assert fired
    assert _now(ws, d).state is State.CANCELLED


def test_a_dependent_paused_before_registration_keeps_its_dependencies(ws: Workspace) -> None:
    [a] = [_reg(ws, h) for h in _submit(ws, "dep")]
    [d] = _submit(ws, "child", after=("tag:dep",))
    steering.pause(ws, d)
    assert _now(ws, d).state is State.PAUSED and _now(ws, d).marker.after
    steering.cancel(ws, _now(ws, a))
    assert _now(ws, d).state is State.CANCELLED  # policy ok, even while paused


def test_a_batch_rerun_watches_the_members_its_dead_first_run_did_not(ws: Workspace) -> None:
    [a] = [_reg(ws, h) for h in _submit(ws, "dep")]
    set_id = _set_id("batch1", "tag:dep", AfterPolicy.OK)
    # the first run published the set and was killed before watching its members
    DependencySets(ws).create(
        "tag:dep", AfterPolicy.OK, resolve_after(ws, "tag:dep"), actor="t", set_id=set_id
    )
    [d] = [_reg(ws, h) for h in _submit(ws, "child", after=("tag:dep",), seed="batch1")]
    assert _now(ws, d).state is State.WAITING
    _succeed(ws, _now(ws, a))
    assert _now(ws, d).state is State.READY


def test_gc_keeps_a_set_while_a_dependent_still_waits_for_another(ws: Workspace) -> None:
    [fast] = [_reg(ws, h) for h in _submit(ws, "fast")]
    [slow] = [_reg(ws, h) for h in _submit(ws, "slow")]
    [d] = [_reg(ws, h) for h in _submit(ws, "child", after=("tag:fast", "tag:slow"))]
    _succeed(ws, _now(ws, fast))
    report = collect(ws, dry_run=False, now=time.time() + 31 * 86400)
    assert not [i for i in report.items if i.kind == "dependency_set"]
    _succeed(ws, _now(ws, slow))
    assert _now(ws, d).state is State.READY
    report = collect(ws, dry_run=False, now=time.time() + 31 * 86400)
    assert len([i for i in report.items if i.kind == "dependency_set"]) == 2


def test_a_resume_during_a_release_is_seen_by_the_release(ws: Workspace) -> None:
    [a] = [_reg(ws, h) for h in _submit(ws, "dep")]
    # more dependents in one placement than the release looks up by their hints
    ds = [_reg(ws, h) for h in _submit(ws, "child", after=("tag:dep",), n=9, placement="p")]
    for h in ds:
        steering.pause(ws, _now(ws, h))
    victim = ds[0]
    paused_dir = ws.state_dir(State.PAUSED, "p")
    real = fsio.fs.scandir
    done: list[int] = []

    def scandir(path: str):  # type: ignore[no-untyped-def]
        if path == paused_dir and not done:
            done.append(1)
            # a resume that decided "wait" renames paused -> waiting, and is killed
            h = _now(ws, victim)
            body = current_frame(ws, h).body.carry(why="after")
            transition(ws, h, State.WAITING, body, actor="cli")
        return real(path)

    fsio.fs.scandir = scandir  # type: ignore[method-assign]
    try:
        _succeed(ws, _now(ws, a))
    finally:
        fsio.fs.scandir = real  # type: ignore[method-assign]
    assert done
    assert _now(ws, victim).state is State.READY
    for h in ds[1:]:
        now = _now(ws, h)
        assert now.state is State.PAUSED and not now.marker.after
        assert steering.resume(ws, now).after is State.READY
