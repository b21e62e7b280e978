"""discovery: bounded, resumable, streaming walks over the marker tree."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator

import pytest
from helpers import plant_marker

from httk_flow.protocol.discovery import (
    HEARTBEAT_EVERY,
    MarkerStream,
    markers_of_placement,
    walk_all,
)
from httk_flow.protocol.names import Marker
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle
from httk_flow.protocol.workspace import Workspace


class _CountingScandir:
    """Counts every directory entry handed out by os.scandir (the unit of the budget)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entries = 0
        real = os.scandir

        def scandir(path: str) -> Iterator[os.DirEntry[str]]:
            def gen() -> Iterator[os.DirEntry[str]]:
                with real(path) as it:
                    for entry in it:
                        self.entries += 1
                        yield entry

            return gen()

        monkeypatch.setattr(os, "scandir", scandir)


def _tree(ws: Workspace, state: State, layout: dict[str, int]) -> set[tuple[str, str]]:
    """Plant `count` markers in each placement; returns {(placement, key)}."""
    out = set()
    for placement, count in layout.items():
        for _ in range(count):
            h = plant_marker(ws, state, placement)
            out.add((placement, h.key))
    return out


def _drain_one_cycle(stream: MarkerStream, budget: int) -> list[JobHandle]:
    found: list[JobHandle] = []
    calls = 0
    while stream.cycles < 1:
        found += stream.next_batch(budget)
        calls += 1
        assert calls < 100_000
    return found


def test_a_call_visits_at_most_its_budget_of_entries(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree(ws, State.READY, {f"d{i}/e{j}": 7 for i in range(6) for j in range(5)})
    counter = _CountingScandir(monkeypatch)
    stream = MarkerStream(ws, State.READY)
    per_call = []
    while stream.cycles < 1:
        before = counter.entries
        batch = stream.next_batch(25)
        per_call.append(counter.entries - before)
        assert len(batch) <= 25
    assert max(per_call) <= 25
    # 210 markers + 30 leaf dirs + 6 dirs, every one visited exactly once in the cycle
    assert sum(per_call) == 210 + 30 + 6
    assert len(per_call) >= (210 + 36) // 25


def test_a_stream_resumes_where_it_stopped_and_finds_each_marker_once_per_cycle(
    ws: Workspace,
) -> None:
    flat = _tree(ws, State.READY, {"flat": 1000})
    stream = MarkerStream(ws, State.READY)
    first = stream.next_batch(100)
    second = stream.next_batch(100)
    assert len(first) == 99  # the first entry visited is the placement directory itself
    assert len(second) == 100
    assert not {h.key for h in first} & {h.key for h in second}
    rest = _drain_one_cycle(stream, 100)
    keys = [h.key for h in first + second + rest]
    assert len(keys) == len(set(keys)) == 1000
    assert {("flat", k) for k in keys} == flat
    # the next cycle starts over and sees everything again
    again = _drain_one_cycle_again(stream, 100)
    assert {h.key for h in again} == {k for _, k in flat}


def _drain_one_cycle_again(stream: MarkerStream, budget: int) -> list[JobHandle]:
    start = stream.cycles
    found: list[JobHandle] = []
    while stream.cycles < start + 1:
        found += stream.next_batch(budget)
    return found


@pytest.mark.parametrize("budget", [1, 7, 64, 5000])
def test_one_cycle_finds_every_marker_across_many_placements_without_duplicates(
    ws: Workspace, budget: int
) -> None:
    layout = {f"jobs/{i:03x}": 1 + i % 5 for i in range(60)}
    layout |= {"deep/a/b/c/d": 9, "top": 4, "jobs/00a/nested": 3}
    planted = _tree(ws, State.READY, layout)
    _tree(ws, State.CLAIMED, {"jobs/000": 5})  # another kind is not visited
    found = _drain_one_cycle(MarkerStream(ws, State.READY), budget)
    pairs = [(h.placement, h.key) for h in found]
    assert len(pairs) == len(set(pairs))
    assert set(pairs) == planted
    assert all(h.state is State.READY for h in found)


def test_a_found_handle_parses_back_to_the_planted_marker(ws: Workspace) -> None:
    planted = plant_marker(ws, State.WAITING, "x/y", priority=3, generation=40)
    [found] = list(walk_all(ws, State.WAITING))
    assert found == planted
    assert os.path.isfile(found.path(ws))


def test_multiple_prefixes_share_each_call_and_rotate(ws: Workspace) -> None:
    planted = _tree(ws, State.READY, {"a": 60, "b": 60, "c": 60, "skip": 10})
    stream = MarkerStream(ws, State.READY, ("a", "b", "c"))
    batch = stream.next_batch(30)
    assert Counter(h.placement for h in batch) == {"a": 10, "b": 10, "c": 10}
    # a budget smaller than the prefixes: each call starts with the next prefix in turn
    turns = [h.placement for _ in range(6) for h in stream.next_batch(1)]
    assert turns == ["a", "b", "c", "a", "b", "c"]
    found = batch + [h for _ in range(100) for h in stream.next_batch(30)]
    assert {(h.placement, h.key) for h in found} >= {p for p in planted if p[0] != "skip"}
    assert "skip" not in {h.placement for h in found}


def test_a_missing_prefix_counts_as_a_finished_walk(ws: Workspace) -> None:
    planted = _tree(ws, State.READY, {"here": 5})
    stream = MarkerStream(ws, State.READY, ("here", "not/yet"))
    found = _drain_one_cycle(stream, 3)
    assert {(h.placement, h.key) for h in found} == planted


def test_walk_all_with_several_prefixes_yields_each_marker_once(ws: Workspace) -> None:
    planted = _tree(ws, State.READY, {"small": 3, "large/x": 3000, "large/y": 2000})
    found = [(h.placement, h.key) for h in walk_all(ws, State.READY, ("small", "large"))]
    assert len(found) == len(set(found)) == 5003
    assert set(found) == planted


def test_walk_all_of_an_empty_state_yields_nothing(ws: Workspace) -> None:
    assert list(walk_all(ws, State.PAUSED)) == []
    assert list(walk_all(ws, State.PAUSED, ("no/such/prefix",))) == []


def test_symlinks_and_non_marker_files_are_reported_and_skipped(
    ws: Workspace, tmp_path: os.PathLike[str]
) -> None:
    good = plant_marker(ws, State.READY, "p")
    d = ws.state_dir(State.READY, "p")
    outside = os.path.join(str(tmp_path), "outside")
    os.makedirs(os.path.join(outside, "sub"))
    with open(os.path.join(outside, "target"), "w"):
        pass
    last = "e" if good.key.endswith("f") else "f"  # never the good key itself
    fake = Marker(good.key[:-1] + last, 500, 0, good.marker.ref).name
    os.symlink(os.path.join(outside, "target"), os.path.join(d, fake))  # marker-named symlink
    os.symlink(outside, os.path.join(d, "linkdir"))  # a symlinked directory is never entered
    with open(os.path.join(d, "README.txt"), "w"):
        pass
    with open(os.path.join(d, ".hidden-tmp"), "w"):
        pass  # dot files are in-flight temporaries: skipped silently
    bad: list[tuple[str, str]] = []
    stream = MarkerStream(ws, State.READY, on_bad=lambda path, why: bad.append((path, why)))
    found = _drain_one_cycle(stream, 2)
    assert found == [good]
    assert sorted(os.path.basename(p) for p, _ in bad) == sorted([fake, "linkdir", "README.txt"])
    assert all(why for _, why in bad)


def test_a_heartbeat_is_called_from_inside_a_long_scan(ws: Workspace) -> None:
    _tree(ws, State.READY, {"many": 3 * HEARTBEAT_EVERY})
    beats = Counter[str]()
    stream = MarkerStream(ws, State.READY)
    stream.next_batch(3 * HEARTBEAT_EVERY, heartbeat=lambda: beats.update(["beat"]))
    assert beats["beat"] == 3


def test_markers_added_behind_the_cursor_are_found_next_cycle(ws: Workspace) -> None:
    first = _tree(ws, State.READY, {"a": 10})
    stream = MarkerStream(ws, State.READY)
    got = _drain_one_cycle(stream, 4)
    later = _tree(ws, State.READY, {"a": 5, "b": 5})
    got2 = _drain_one_cycle_again(stream, 4)
    assert {(h.placement, h.key) for h in got} == first
    assert {(h.placement, h.key) for h in got2} == first | later


def test_an_unreadable_directory_is_reported_and_the_walk_goes_on(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted = _tree(ws, State.READY, {"ok/a": 5, "locked/x": 3, "ok/b": 5})
    locked = ws.state_dir(State.READY, "locked")
    real = os.scandir

    def scandir(path: str) -> Iterator[os.DirEntry[str]]:
        # another user's directory (0700): tests often run as root, so refuse it by hand
        if os.path.abspath(path) == locked:
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    bad: list[str] = []
    stream = MarkerStream(ws, State.READY, on_bad=lambda path, why: bad.append(path))
    found = _drain_one_cycle(stream, 4)
    assert {(h.placement, h.key) for h in found} == {p for p in planted if p[0] != "locked/x"}
    assert bad == [locked]


def test_markers_of_placement_lists_each_state_kind_of_one_placement(ws: Workspace) -> None:
    ready = plant_marker(ws, State.READY, "jobs/abc")
    waiting = plant_marker(ws, State.WAITING, "jobs/abc")
    plant_marker(ws, State.READY, "jobs/abc/deeper")  # another placement: not listed
    plant_marker(ws, State.READY, "jobs/xyz")
    litter = os.path.join(ws.state_dir(State.READY, "jobs/abc"), "not-a-marker")
    open(litter, "x").close()
    found = list(markers_of_placement(ws, "jobs/abc"))
    assert sorted((st.value, m.key) for st, m in found) == sorted(
        [(State.READY.value, ready.key), (State.WAITING.value, waiting.key)]
    )
    assert [st for st, _ in found] == [st for st in State if st in (State.READY, State.WAITING)]
    assert list(markers_of_placement(ws, "jobs/abc", (State.WAITING,))) == [
        (State.WAITING, waiting.marker)
    ]
    assert list(markers_of_placement(ws, "jobs/nowhere")) == []
