"""A remembering marker stream stats, rather than lists, directories that stay empty,
and still finds every marker renamed into one (discovery._QuietDirs)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from helpers import plant_marker, record_listdir

from httk_flow.protocol import discovery
from httk_flow.protocol.counting import markers_wanted
from httk_flow.protocol.discovery import RELIST_EVERY, SETTLE, MarkerStream
from httk_flow.protocol.handles import JobHandle
from httk_flow.protocol.names import Marker, RecordRef, marker_service, new_id
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

SHARDS = [f"jobs/{i:02x}" for i in range(8)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Listings:
    """Counts the directories the stream lists (its _scandir calls), by path."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        real = discovery._scandir

        def counting(path: str) -> Iterator[os.DirEntry[str]] | None:
            self.paths.append(path)
            return real(path)

        monkeypatch.setattr(discovery, "_scandir", counting)

    def shards(self) -> int:
        n = sum(1 for p in self.paths if os.path.basename(os.path.dirname(p)) == "jobs")
        self.paths.clear()
        return n


def _shards(ws: Workspace) -> None:
    for shard in SHARDS:
        os.makedirs(ws.state_dir(State.READY, shard), exist_ok=True)


def _cycle(stream: MarkerStream, clock: Clock) -> list[JobHandle]:
    """One whole cycle, then time moves on past SETTLE."""
    start, found = stream.cycles, []
    while stream.cycles == start:
        found += stream.next_batch(1000)
    clock.now += SETTLE + 0.1
    return found


def _stream(ws: Workspace, clock: Clock, remember: bool = True) -> MarkerStream:
    return MarkerStream(ws, State.READY, clock=clock, remember=remember)


def test_empty_directories_are_listed_until_confirmed_then_only_statted(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    _shards(ws)
    listings, clock = Listings(monkeypatch), Clock()
    stream = _stream(ws, clock)
    assert _cycle(stream, clock) == [] and listings.shards() == len(SHARDS)
    assert _cycle(stream, clock) == [] and listings.shards() == len(SHARDS)  # confirms
    for _ in range(RELIST_EVERY - 3):
        assert _cycle(stream, clock) == []
        assert listings.shards() == 0
    # every RELIST_EVERY-th cycle lists them all again, whatever their signatures say
    assert _cycle(stream, clock) == [] and listings.shards() == len(SHARDS)
    assert _cycle(stream, clock) == [] and listings.shards() == 0


def test_a_stream_that_does_not_remember_lists_every_directory_every_cycle(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    _shards(ws)
    listings, clock = Listings(monkeypatch), Clock()
    stream = _stream(ws, clock, remember=False)
    for _ in range(4):
        _cycle(stream, clock)
        assert listings.shards() == len(SHARDS)


def test_a_second_look_within_settle_does_not_confirm(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two empty listings in one timestamp tick prove nothing: a name renamed in right
    after the first leaves mtime as it was."""
    _shards(ws)
    listings, clock = Listings(monkeypatch), Clock()
    stream = _stream(ws, clock)
    for _ in range(3):
        start = stream.cycles
        while stream.cycles == start:
            stream.next_batch(1000)
        clock.now += SETTLE / 4
    listings.shards()
    _cycle(stream, clock)
    assert listings.shards() == len(SHARDS)


def test_a_marker_renamed_into_a_confirmed_directory_is_found_next_cycle(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    _shards(ws)
    clock = Clock()
    stream = _stream(ws, clock)
    for _ in range(3):
        assert _cycle(stream, clock) == []
    h = plant_marker(ws, State.READY, SHARDS[3])
    assert [x.key for x in _cycle(stream, clock)] == [h.key]


def test_a_change_that_keeps_mtime_is_still_seen(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name that lands within the tick of the last look leaves mtime alone: ctime (and
    the inode, for a directory removed and made again) are in the signature too."""
    _shards(ws)
    clock = Clock()
    stream = _stream(ws, clock)
    for _ in range(3):
        _cycle(stream, clock)
    d = ws.state_dir(State.READY, SHARDS[5])
    before = os.stat(d)
    h = plant_marker(ws, State.READY, SHARDS[5])
    os.utime(d, ns=(before.st_atime_ns, before.st_mtime_ns))  # mtime as it was
    assert os.stat(d).st_mtime_ns == before.st_mtime_ns
    assert [x.key for x in _cycle(stream, clock)] == [h.key]
    # removed and made again (a retired shard): a new inode, found too
    os.unlink(h.path(ws))
    for _ in range(3):
        _cycle(stream, clock)
    os.rmdir(d)
    h2 = plant_marker(ws, State.READY, SHARDS[5])
    assert [x.key for x in _cycle(stream, clock)] == [h2.key]


def test_a_directory_with_markers_is_listed_every_cycle(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only empty directories are remembered: a ready job in backoff is offered again
    every cycle, so its directory is read every cycle."""
    _shards(ws)
    h = plant_marker(ws, State.READY, SHARDS[0])
    clock = Clock()
    stream = _stream(ws, clock)
    for _ in range(RELIST_EVERY + 2):
        assert [x.key for x in _cycle(stream, clock)] == [h.key]


def test_a_directory_of_markers_its_filter_refuses_is_remembered_as_empty(
    flat_ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim stream beside another pool's backlog: shards holding only markers of a
    class it does not serve are stat'ed once confirmed, never retired, and a marker of
    its own renamed into one is found the next cycle."""
    ws = flat_ws  # other pools' markers beside ours, in one directory
    _shards(ws)
    theirs = []
    for shard in SHARDS:
        for _ in range(3):
            m = Marker(new_id(), 500, 1, RecordRef("w0", 0, 0), service="q1")
            h = JobHandle(State.READY, shard, m)
            with open(h.path(ws), "xb"):
                pass
            theirs.append(h.path(ws))
    listings, clock = Listings(monkeypatch), Clock()
    stream = MarkerStream(
        ws, State.READY, clock=clock, remember=True, names=lambda n: marker_service(n) != "q1"
    )
    assert _cycle(stream, clock) == [] and listings.shards() == len(SHARDS)
    assert _cycle(stream, clock) == [] and listings.shards() == len(SHARDS)  # confirms
    assert _cycle(stream, clock) == [] and listings.shards() == 0
    ours = plant_marker(ws, State.READY, SHARDS[4])
    assert [x.key for x in _cycle(stream, clock)] == [ours.key]
    assert listings.shards() == 1
    assert all(os.path.exists(p) for p in theirs)


def test_a_look_shares_the_streams_memory_of_directories_holding_nothing_of_ours(
    flat_ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle check looks every tick (counting.markers_wanted): two of its looks SETTLE
    apart confirm the shards of other pools' markers, later looks and the stream stat
    them, and a marker of ours renamed into one is found by the next look."""
    ws = flat_ws  # other pools' markers beside ours, in one directory
    _shards(ws)
    for shard in SHARDS:
        m = Marker(new_id(), 500, 1, RecordRef("w0", 0, 0), service="q1")
        with open(JobHandle(State.READY, shard, m).path(ws), "xb"):
            pass
    listed = record_listdir(monkeypatch)
    stream_listings, clock = Listings(monkeypatch), Clock()

    def wants(name: str) -> bool:
        return marker_service(name) != "q1"

    stream = MarkerStream(ws, State.READY, clock=clock, remember=True, names=wants)

    def look() -> tuple[list[str], int]:
        listed.clear()
        found = markers_wanted(ws, State.READY, (), wants, lambda: (), memory=stream)
        keys = [h.key for h in found]
        clock.now += SETTLE + 0.1
        return keys, sum(1 for p in listed if os.path.basename(os.path.dirname(p)) == "jobs")

    assert look() == ([], len(SHARDS))
    assert look() == ([], len(SHARDS))  # confirms
    assert look() == ([], 0)
    assert _cycle(stream, clock) == [] and stream_listings.shards() == 0
    ours = plant_marker(ws, State.READY, SHARDS[4])
    assert look() == ([ours.key], 1)
    # a directory holding one of ours is listed every time
    for _ in range(3):
        assert look() == ([ours.key], 1)
