"""Dependency sets (protocol.md §14) at the file level: each member counted once however
many processes count its end, one decision per set, policies, and job.json round trips."""

from __future__ import annotations

import multiprocessing
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from httk_flow.errors import InvalidJob
from httk_flow.protocol.after import After, AfterPolicy, DependencySets, afters_from_json, verdict
from httk_flow.protocol.handles import JobHandle
from httk_flow.protocol.names import Marker, RecordRef
from httk_flow.protocol.release import count_end, make_set
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace


def _handle(i: int, state: State) -> JobHandle:
    key = f"m--{i:032x}"
    return JobHandle(state, f"jobs/{i % 7:02x}", Marker(key, 500, 1, RecordRef("w", 0, i)))


def _count_all(root: str, keys: list[str], seed: int, out: multiprocessing.Queue[int]) -> None:
    ws = Workspace.open(root)
    rng = random.Random(seed)
    order = keys[:]
    rng.shuffle(order)
    decided = 0
    for k in order:
        decided += len(count_end(ws, k, State.SUCCEEDED))
    out.put(decided)


def test_four_processes_counting_every_end_decide_the_set_exactly_once(tmp_path: Path) -> None:
    ws = Workspace.create(str(tmp_path / "ws"))
    members = [_handle(i, State.READY) for i in range(300)]
    set_id = make_set(ws, "tag:m", AfterPolicy.OK, members, actor="t")
    q: multiprocessing.Queue[int] = multiprocessing.Queue()
    keys = [h.key for h in members]
    procs = [
        multiprocessing.Process(target=_count_all, args=(ws.root, keys, s, q)) for s in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert sum(q.get(timeout=5) for _ in procs) == 1
    st_ = DependencySets(ws).status(set_id, count=True)
    assert st_.complete and st_.broken is None
    assert st_.ended == {"succeeded": 300} and st_.members == 300
    assert not list(Path(ws.root, ".flow", "watch").iterdir())


@given(
    st.lists(st.sampled_from([State.SUCCEEDED, State.FAILED, State.CANCELLED]), max_size=6),
    st.sampled_from(list(AfterPolicy)),
)
def test_a_set_is_decided_as_its_policy_says(ends: list[State], policy: AfterPolicy) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        ws = Workspace.create(str(Path(d) / "ws"))
        members = [_handle(i, State.READY) for i in range(len(ends))] or [
            _handle(99, State.SUCCEEDED)
        ]
        set_id = make_set(ws, "s", policy, members, actor="t")
        for h, end in zip(members, ends, strict=False):
            count_end(ws, h.key, end)
        v = verdict(ws, [After(set_id, "s", policy)])
        counted = [e for e in ends if policy.counts(e)]
        broken = any(policy.breaks(e) for e in ends)
        if broken:
            assert v.kind == ("fail" if policy is AfterPolicy.FAIL else "cancel")
        elif len(counted) == len(ends):
            assert v.kind == "ready"
        else:
            assert v.kind == "wait"
        ws.close()


def test_members_that_ended_before_the_set_was_made_are_counted_at_once(tmp_path: Path) -> None:
    ws = Workspace.create(str(tmp_path / "ws"))
    done = [_handle(1, State.SUCCEEDED), _handle(2, State.SUCCEEDED)]
    set_id = make_set(ws, "tag:x", AfterPolicy.OK, done, actor="t")
    assert verdict(ws, [After(set_id, "tag:x", AfterPolicy.OK)]).kind == "ready"
    bad = make_set(ws, "tag:y", AfterPolicy.OK, [_handle(3, State.FAILED)], actor="t")
    v = verdict(ws, [After(set_id, "x", AfterPolicy.OK), After(bad, "tag:y", AfterPolicy.OK)])
    assert v.kind == "cancel" and "failed" in v.reason and "tag:y" in v.reason


def test_a_missing_set_fails_its_dependent_rather_than_waiting_for_ever(tmp_path: Path) -> None:
    ws = Workspace.create(str(tmp_path / "ws"))
    v = verdict(ws, [After("0" * 20, "tag:gone", AfterPolicy.OK)])
    assert v.kind == "fail" and "missing" in v.reason


def test_after_round_trips_and_bad_entries_are_refused() -> None:
    a = After("ab" * 10, "group:relax", AfterPolicy.ANY)
    assert afters_from_json([a.to_json()], "job.json") == (a,)
    assert afters_from_json(None, "job.json") == ()
    for bad in (
        [{"set": "x", "selector": "s", "policy": "ok"}],
        [{"set": "ab" * 10, "selector": "s", "policy": "sometimes"}],
        ["text"],
        {"set": "ab" * 10},
    ):
        with pytest.raises(InvalidJob):
            afters_from_json(bad, "job.json")


def test_a_marker_with_unmet_dependencies_round_trips_and_old_names_read_without() -> None:
    m = Marker("k--" + "a" * 32, 500, 3, RecordRef("w1", 2, 9), after=True)
    assert m.name.endswith(".a.w1-2-9")
    assert Marker.from_name(m.name) == m
    old = Marker.from_name("a" * 32 + ".p500.g3.cx1.w1-2-9")
    assert not old.after and old.service == "x1"
    assert not m.successor(RecordRef("w1", 2, 10)).after
