"""count_markers, tally_markers, count_after: one search per directory counts what one
parse per name does, on real directories, whether a directory is listed by name (the
plain filesystem) or by entry (through the seam)."""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import signal
import stat
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Literal

import pytest
from helpers import record_listdir
from hypothesis import assume, given
from hypothesis import strategies as st

from httk_flow.ops.status import GroupBy, workspace_status
from httk_flow.protocol import counting, layout, names
from httk_flow.protocol.counting import (
    STAT_MAX,
    _count,
    _not_markers,
    _per_directory,
    count_after,
    count_markers,
    markers_wanted,
    tally_markers,
)
from httk_flow.protocol.fsio import FileSystem, set_filesystem
from httk_flow.protocol.names import Marker, RecordRef, to36
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

#: valid tags a careless pattern gets wrong: ending in '-', holding '--', all hex digits
ODD_TAGS = ["a-", "x--y", "a--", "Z_+-", "0", "0" * 32, "f" * 64, "deadbeef", "a" * 63 + "-"]
ids = st.from_regex(names.ID_RE, fullmatch=True)
tags = st.sampled_from(ODD_TAGS) | st.from_regex(names.TAG_RE, fullmatch=True)
b36 = st.integers(0, 36**13 - 1)
b36_text = st.from_regex(r"[0-9a-z]{1,16}", fullmatch=True)
markers = st.builds(
    Marker,
    key=st.builds(names.make_key, ids, st.none() | tags),
    priority=st.integers(0, names.MAX_PRIORITY),
    generation=b36,
    ref=st.builds(RecordRef, st.from_regex(names.WRITER_RE, fullmatch=True), b36, b36),
    not_before=st.just(0) | st.integers(1, 36**13 - 1),
    service=st.just("") | b36_text,
    group_digest=st.just("") | st.from_regex(r"[0-9a-z]{8}", fullmatch=True),
    after=st.booleans(),
)
valid = markers.map(lambda m: m.name) | st.from_regex(names.MARKER_RE, fullmatch=True)


def _mangle(name: str, at: int, text: str) -> str:
    at %= len(name) + 1
    return name[:at] + text + name[at + 1 :]


#: names no filesystem holds (lone surrogates cannot be encoded)
_SURROGATES: tuple[Literal["Cs"]] = ("Cs",)

invalid = st.one_of(
    st.tuples(valid, valid).map("\n".join),  # two names of the grammar on two lines
    valid.map(lambda n: n + "\n"),
    valid.map(lambda n: "\n" + n),
    valid.map(lambda n: names.BIRTH_PREFIX + n),
    valid.map(lambda n: f".{n}.swp"),
    valid.map(lambda n: n + "~"),
    valid.map(str.upper),
    st.builds(_mangle, valid, st.integers(0, 200), st.text(max_size=3)),
    st.text(st.characters(exclude_categories=_SURROGATES), min_size=1, max_size=40),
)


def _storable(name: str) -> bool:
    return (
        name not in ("", ".", "..")
        and "/" not in name
        and "\0" not in name
        and len(os.fsencode(name)) <= 255
    )


file_names = (valid | invalid).filter(_storable)
components = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.+=@,-]{0,12}", fullmatch=True)
#: where names go below a state kind: shards, a child's placement inside a shard, placements
#: with dots, a directory named like a marker
placements = st.one_of(
    st.just(""),
    st.sampled_from(["jobs/ab", "jobs/ab/0123456789abcdef0123456789abcdef", "runs/v1.2"]),
    st.lists(components, min_size=1, max_size=3).map("/".join),
    valid.filter(_storable).map(lambda n: f"jobs/ab/{n}"),
)
trees = st.lists(st.tuples(placements, file_names), max_size=40)


class _ByEntry(FileSystem):
    """The plain filesystem through the seam, as a model would be: listed by entry."""


@contextlib.contextmanager
def _by_entry() -> Iterator[None]:
    previous = set_filesystem(_ByEntry())
    try:
        yield
    finally:
        set_filesystem(previous)


def _plant(ws: Workspace, state: State, tree: list[tuple[str, str]]) -> None:
    for placement, name in tree:
        d = ws.state_dir(state, placement)
        try:
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, name), "xb"):
                pass
        except (FileExistsError, NotADirectoryError, IsADirectoryError):
            continue  # a name given twice, or the name of a directory made before


def _reference(ws: Workspace, state: State) -> list[Marker]:
    """Every regular file under the state kind that parses as a marker, one parse each."""
    out = []
    for parent, _, files in os.walk(ws.state_dir(state)):
        for name in files:
            if not stat.S_ISREG(os.lstat(os.path.join(parent, name)).st_mode):
                continue
            m = Marker.parse_or_none(name)
            assert (m is None) == (names.MARKER_RE.fullmatch(name) is None)
            if m is not None:
                out.append(m)
    return out


def _counts(
    ws: Workspace, state: State, split: bool = False
) -> tuple[int, Counter[tuple[str | None, str | None]], tuple[int, int]]:
    return (
        count_markers(ws, state, split=split),
        tally_markers(ws, state, split=split),
        count_after(ws, state, split=split),
    )


def _expected(
    found: list[Marker],
) -> tuple[int, Counter[tuple[str | None, str | None]], tuple[int, int]]:
    tally = Counter(
        (to36(m.not_before) if m.not_before else None, m.service or None) for m in found
    )
    return len(found), tally, (len(found), sum(m.after for m in found))


def _check(ws: Workspace, state: State) -> None:
    want = _expected(_reference(ws, state))
    for listing in (contextlib.nullcontext, _by_entry):
        with listing():
            got = _counts(ws, state)
        assert got == want
        with listing(), _split_at(1):
            assert _counts(ws, state, split=True) == want
        # Counters compare equal with entries of 0; a caller iterating them must see none
        assert 0 not in got[1].values()


@contextlib.contextmanager
def _workspace(class_dirs: bool = False) -> Iterator[Workspace]:
    """A workspace whose ready markers of every class lie in their placement's directory
    (unless `class_dirs`): what is counted and passed by here is names."""
    with tempfile.TemporaryDirectory() as tmp:
        ws = Workspace.create(os.path.join(tmp, "ws"), class_dirs=class_dirs)
        try:
            yield ws
        finally:
            ws.close()


@given(trees)
def test_one_search_per_directory_counts_what_one_parse_per_name_does(
    tree: list[tuple[str, str]],
) -> None:
    with _workspace() as ws:
        _plant(ws, State.READY, tree)
        _check(ws, State.READY)


@given(valid.filter(_storable), valid.filter(_storable))
def test_two_marker_names_on_two_lines_are_one_name_and_no_marker(a: str, b: str) -> None:
    assume(_storable(f"{a}\n{b}"))
    with _workspace() as ws:
        _plant(ws, State.READY, [("jobs/ab", f"{a}\n{b}"), ("jobs/ab", f"{a}\n"), ("jobs/cd", b)])
        assert _counts(ws, State.READY)[0] == 1
        _check(ws, State.READY)


def _name(*, not_before: int = 0, service: str = "", after: bool = False) -> str:
    ref = RecordRef("w0", 0, 0)
    return Marker(names.new_id(), 500, 1, ref, not_before, service, after=after).name


def test_a_directory_named_like_a_marker_is_walked_not_counted() -> None:
    """Nothing but the link count tells it from a file when names alone are listed."""
    with _workspace() as ws:
        odd = _name()
        _plant(ws, State.READY, [("jobs/ab", _name()), ("jobs/ab", _name(service="q1"))])
        _plant(ws, State.READY, [(f"jobs/ab/{odd}", _name()), (f"jobs/ab/{odd}", _name())])
        os.mkdir(ws.state_dir(State.READY, f"jobs/ab/{_name()}"))  # empty, and no marker
        assert count_markers(ws, State.READY) == 4
        assert tally_markers(ws, State.READY) == {(None, None): 3, (None, "q1"): 1}
        _check(ws, State.READY)


def test_no_markers_tally_to_nothing() -> None:
    with _workspace() as ws:
        _plant(ws, State.READY, [("jobs/ab", "junk"), ("jobs/cd", f"{_name()}.tmp")])
        os.makedirs(ws.state_dir(State.READY, "jobs/ef"))
        assert tally_markers(ws, State.READY) == Counter()
        assert list(tally_markers(ws, State.READY).items()) == []
        _check(ws, State.READY)


def test_placements_with_dots_beside_markers_and_stray_files_are_walked() -> None:
    with _workspace() as ws:
        shard = [("jobs/ab", _name()) for _ in range(5)]
        strays = [("jobs/ab", n) for n in ("notes.txt", ".#lock", "README", f"{_name()}.tmp")]
        inner = [("jobs/ab/v1.2", _name(not_before=7)), ("jobs/ab/v1.2/x.y", _name(after=True))]
        _plant(ws, State.WAITING, shard + strays + inner)
        assert count_markers(ws, State.WAITING) == 7
        assert count_after(ws, State.WAITING) == (7, 1)
        assert tally_markers(ws, State.WAITING)[("7", None)] == 1
        _check(ws, State.WAITING)


def test_a_directory_of_many_other_names_is_listed_by_entry() -> None:
    """More than STAT_MAX names that are no markers: one listing with types, not an lstat
    each; the count is the same."""
    with _workspace() as ws:
        parents = [names.new_id() for _ in range(STAT_MAX + 8)]
        tree = [(f"jobs/ab/{p}", _name()) for p in parents]
        tree += [("jobs/ab", _name()) for _ in range(3)]
        tree += [("jobs/ab", f"stray{i}") for i in range(STAT_MAX + 8)]
        _plant(ws, State.READY, tree)
        assert count_markers(ws, State.READY) == len(parents) + 3
        _check(ws, State.READY)


def test_a_huge_directory_is_searched_in_slices() -> None:
    from httk_flow.protocol import counting

    with _workspace() as ws:
        n = counting.SCAN_SLICE + 5
        tree = [("jobs/ab", _name(service="c" if i % 3 == 0 else "")) for i in range(n)]
        tree += [("jobs/ab", "zz-stray"), ("jobs/ab", "sub")]
        _plant(ws, State.READY, tree[:-1])
        os.mkdir(ws.state_dir(State.READY, "jobs/ab/sub"))
        _plant(ws, State.READY, [("jobs/ab/sub", _name())])
        assert count_markers(ws, State.READY) == n + 1
        assert tally_markers(ws, State.READY) == {
            (None, None): n + 1 - (n + 2) // 3,
            (None, "c"): (n + 2) // 3,
        }
        _check(ws, State.READY)


@given(st.lists(file_names, max_size=30))
def test_the_names_that_are_no_markers_are_all_found(given_names: list[str]) -> None:
    """Dotless ones when every dotted name is a marker, else every name the grammar
    refuses: a directory among them (its name may hold dots) is walked, whatever the
    filesystem says of its link count."""
    refused = [n for n in given_names if names.MARKER_RE.fullmatch(n) is None]
    others = _not_markers(given_names, len(given_names) - len(refused))
    assert sorted(others) == sorted(refused)


def _blocked(ws: Workspace, by: GroupBy = "state") -> dict[str, int]:
    return dict(workspace_status(ws, by=by).blocked)


def test_status_counts_waiting_dependencies_by_name_as_a_walk_does() -> None:
    with _workspace() as ws:
        tree = [("jobs/ab", _name(after=True)) for _ in range(3)]
        tree += [("jobs/cd", _name()) for _ in range(2)] + [("jobs/cd", "junk.a")]
        _plant(ws, State.WAITING, tree)
        why = "waiting for dependencies that have not ended (`flow show JOB` names them)"
        by_name, walked = _blocked(ws), _blocked(ws, by="tag")
        assert by_name[why] == walked[why] == 3
        assert workspace_status(ws).counts[State.WAITING] == 5


def test_status_reports_a_paused_allocation_queue_only_with_ready_jobs() -> None:
    from httk_flow.scale.allocation_records import AllocationStore

    with _workspace() as ws:
        AllocationStore(ws).pause("three failures")
        assert not any(w.startswith("allocation queue paused") for w in _blocked(ws))
        _plant(ws, State.READY, [("jobs/ab", _name()), ("jobs/ab", _name())])
        assert _blocked(ws)["allocation queue paused: three failures"] == 2
        AllocationStore(ws).unpause()
        assert not os.path.exists(layout.allocations_paused(ws.root))
        assert not any(w.startswith("allocation queue paused") for w in _blocked(ws))


@contextlib.contextmanager
def _split_at(pending: int) -> Iterator[list[int]]:
    """Split counts fork once `pending` directories wait; yields the children's pids."""
    pids: list[int] = []
    real_fork, split_min = os.fork, counting.SPLIT_MIN

    def fork() -> int:
        pid = real_fork()
        pids.append(pid)
        return pid

    os.fork, counting.SPLIT_MIN = fork, pending  # type: ignore[misc]
    try:
        yield pids
    finally:
        os.fork, counting.SPLIT_MIN = real_fork, split_min  # type: ignore[misc]


def _shards(ws: Workspace, n: int, per: int) -> None:
    tree = [
        (f"jobs/{i:02x}", _name(service="q" if j % 4 else "")) for i in range(n) for j in range(per)
    ]
    tree += [("jobs/00/v1.2", _name(after=True)), ("jobs/00", "stray")]
    _plant(ws, State.READY, tree)


_MAY_FORK = counting._may_fork


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    # an earlier test of the same session may leave a thread behind (a manager run in
    # process), which makes a split count walk alone: these tests are about the fork
    monkeypatch.setattr(counting, "_may_fork", lambda: True)


def test_the_split_count_does_not_fork_beside_other_threads() -> None:
    done = threading.Event()
    t = threading.Thread(target=done.wait)
    t.start()
    try:
        assert not _MAY_FORK()
    finally:
        done.set()
        t.join()


def test_a_split_count_forks_one_child_and_counts_what_a_serial_one_does() -> None:
    with _workspace() as ws:
        _shards(ws, 40, 7)
        serial = _counts(ws, State.READY)
        assert serial[0] == 40 * 7 + 1
        with _split_at(counting.SPLIT_MIN) as pids:
            assert _counts(ws, State.READY, split=True) == serial
        assert len(pids) == 3  # one per count
        with _by_entry(), _split_at(1) as pids:
            assert _counts(ws, State.READY, split=True) == serial
        assert pids == []  # through the seam, never


def test_a_split_count_walks_the_childs_share_itself_when_the_child_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(obj: object) -> bytes:
        raise pickle.PicklingError("no")

    with _workspace() as ws:
        _shards(ws, 40, 3)
        serial = _counts(ws, State.READY)
        monkeypatch.setattr(pickle, "dumps", broken)
        with _split_at(2) as pids:
            assert _counts(ws, State.READY, split=True) == serial
        assert len(pids) == 3


@pytest.mark.parametrize("split", [False, True])
def test_directories_gone_mid_walk_are_passed_by(split: bool) -> None:
    with _workspace() as ws:
        _shards(ws, 40, 3)
        walk = _per_directory(ws, State.READY, _count, split)
        with _split_at(4) as pids:
            # the kind's directory and jobs/ are listed: the shards are pending
            got = [next(walk), next(walk)]
            for i in range(1, 40, 3):
                shutil.rmtree(ws.state_dir(State.READY, f"jobs/{i:02x}"))
            got += list(walk)
        assert len(pids) == split
        assert sum(got) == count_markers(ws, State.READY) == 1 + 3 * (40 - 13)


def test_a_split_walk_left_off_leaves_no_child_behind() -> None:
    with _workspace() as ws:
        _shards(ws, 40, 3)
        with _split_at(4) as pids:
            walk = _per_directory(ws, State.READY, _count, True)
            for _ in range(4):
                next(walk)
            walk.close()
        [pid] = pids
        with pytest.raises(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)  # reaped


# -- markers_wanted: a manager's own markers among many of other pools ------------------


def _wanted_reference(
    ws: Workspace, state: State, prefixes: tuple[str, ...], foreign: set[str]
) -> Counter[tuple[str, str]]:
    """(placement, name) of every regular file under the prefixes that parses as a marker
    of a class not in `foreign`, one parse each."""
    out: Counter[tuple[str, str]] = Counter()
    top = ws.state_dir(state)
    for prefix in prefixes or ("",):
        for parent, _, files in os.walk(ws.state_dir(state, prefix)):
            for name in files:
                if not stat.S_ISREG(os.lstat(os.path.join(parent, name)).st_mode):
                    continue
                m = Marker.parse_or_none(name)
                if m is not None and m.service not in foreign:
                    placement = os.path.relpath(parent, top)
                    out[("" if placement == "." else placement, name)] += 1
    return out


def _wanted(
    ws: Workspace, state: State, prefixes: tuple[str, ...], foreign: set[str]
) -> Counter[tuple[str, str]]:
    found = markers_wanted(
        ws,
        state,
        prefixes,
        lambda name: names.marker_service(name) not in foreign,
        lambda: foreign,
    )
    got = Counter((h.placement, h.marker.name) for h in found)
    for placement, name in got:
        assert os.path.isfile(os.path.join(ws.state_dir(state, placement), name))
    return got


def _check_wanted(ws: Workspace, prefixes: tuple[str, ...], foreign: set[str]) -> None:
    want = _wanted_reference(ws, State.READY, prefixes, foreign)
    for listing in (contextlib.nullcontext, _by_entry):
        with listing():
            assert _wanted(ws, State.READY, prefixes, foreign) == want


foreign_classes = st.lists(b36_text | st.just(""), min_size=1, max_size=3).map(set)


@given(
    trees,
    foreign_classes,
    st.lists(st.tuples(st.sampled_from(["jobs/ab", "jobs/cd", ""]), st.integers(0, 2))),
    st.sampled_from([(), ("jobs",), ("jobs/ab", "runs")]),
)
def test_markers_wanted_finds_what_one_parse_per_name_does(
    tree: list[tuple[str, str]],
    foreign: set[str],
    others: list[tuple[str, int]],
    prefixes: tuple[str, ...],
) -> None:
    """Whole directories of other classes passed by, mixed ones parsed, stray names and
    directories named like markers beside them: what is found is what a parse per name
    finds, listed by name or by entry."""
    classes = sorted(foreign)
    with _workspace() as ws:
        _plant(ws, State.READY, tree)
        _plant(ws, State.READY, [("jobs/ff", _name(service=c)) for c in classes * 3])
        _plant(ws, State.READY, [(p, _name(service=classes[i % len(classes)])) for p, i in others])
        _check_wanted(ws, prefixes, foreign)


def test_a_stray_name_with_two_foreign_fields_hides_no_marker() -> None:
    """The count of fields says 'all foreign' (two in one name, none in the other): the
    search of whole names does not."""
    with _workspace() as ws:
        ours = _name()
        _plant(ws, State.READY, [("jobs/ab", "x.cq1..cq1.y"), ("jobs/ab", ours)])
        assert _wanted(ws, State.READY, (), {"q1"}) == {("jobs/ab", ours): 1}
        _check_wanted(ws, (), {"q1"})


@pytest.mark.parametrize("theirs", ["q1", ""])
def test_a_directory_of_other_classes_is_passed_by_without_a_parse(theirs: str) -> None:
    """Thousands of another class's markers, the default class's (no class field)
    included: no name is looked at one by one."""
    with _workspace() as ws:
        _plant(ws, State.READY, [("jobs/ab", _name(service=theirs)) for _ in range(2000)])
        ours = _name(service="q2")
        _plant(ws, State.READY, [("jobs/cd", ours)])
        asked: list[str] = []

        def wants(name: str) -> bool:
            asked.append(name)
            return names.marker_service(name) != theirs

        found = list(markers_wanted(ws, State.READY, (), wants, lambda: [theirs]))
        assert [h.marker.name for h in found] == [ours]
        # the directories' names and ours: not one of the 2,000 of the other class
        assert sorted(asked) == sorted(["jobs", "ab", "cd", ours])


def test_a_look_walks_subdirectories_beside_other_pools_markers_whatever_their_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A child's placement (a job key) and a placement spelled with a class field of
    another pool, beside that pool's markers, are subdirectories: walked, not taken for
    markers. Even where every directory's link count reads 2 (a filesystem that does not
    count subdirectories so), and the count of names alone would look complete."""
    with _workspace() as ws:
        key = names.make_key(names.new_id(), None)
        theirs = [("jobs/ab", _name()) for _ in range(5)] + [("jobs/ab", _name(service="q1"))]
        ours = [(f"jobs/ab/{key}", _name(service="q2")), ("jobs/ab/run.cq1.x", _name(service="q2"))]
        _plant(ws, State.READY, theirs + ours)
        real = os.lstat

        def two_links(path: str, *args: object, **kw: object) -> os.stat_result:
            st = real(path, *args, **kw)  # type: ignore[arg-type]
            if stat.S_ISDIR(st.st_mode):
                return os.stat_result((st.st_mode, st.st_ino, st.st_dev, 2, *tuple(st)[4:]))
            return st

        monkeypatch.setattr(os, "lstat", two_links)
        want = Counter({(p, n): 1 for p, n in ours})
        for foreign in ({"", "q1"}, {"q1"}):
            expected = want if "" in foreign else want + Counter(theirs[:5])
            assert _wanted(ws, State.READY, (), foreign) == expected
            _check_wanted(ws, (), foreign)


def test_a_look_passes_by_the_class_directories_of_classes_not_served_unlisted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where each class's ready markers lie in a class directory (protocol revision 8),
    a class known not to be served is passed by by its directory's name: none of its
    names is listed. What is found carries its placement, not the class directory, and
    a marker outside the directory its class places it in is not found (no manager can
    move it: `flow fsck` reports it)."""
    with _workspace(class_dirs=True) as ws:
        theirs = [("jobs/ab", _name(service="q1")) for _ in range(50)]
        ours = [("jobs/ab", _name(service="q2")), ("jobs/cd", _name()), ("jobs/cd", _name())]
        for placement, name in theirs + ours:
            m = Marker.from_name(name)
            path = ws.marker_path(State.READY, placement, m)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "xb").close()
        assert os.path.isdir(ws.state_dir(State.READY, "jobs/ab/@q1"))
        astray = _name(service="q2")
        _plant(ws, State.READY, [("jobs/cd", astray)])  # where revision 7 placed it
        listed = record_listdir(monkeypatch)

        def wants(name: str) -> bool:
            return names.marker_service(name) != "q1"

        found = list(markers_wanted(ws, State.READY, (), wants, lambda: ["q1"]))
        assert sorted((h.placement, h.marker.name) for h in found) == sorted(ours)
        assert not [p for p in listed if "@q1" in p]
        assert ws.state_dir(State.READY, "jobs/ab/@q2") in listed
        # and with nothing known of q1 yet, its directory is listed and its names passed
        listed.clear()
        found = list(markers_wanted(ws, State.READY, (), wants, list))
        assert len(found) == 3 and ws.state_dir(State.READY, "jobs/ab/@q1") in listed
