"""Counting markers by their names, for `flow status` and the manager's tallies: one
regular-expression search per directory (names.marker_scan), never a call or a parsed
marker per name; and finding a manager's own among many markers of other pools, with
a string count per directory and class (markers_wanted). Read-side only; the
manager's own scans are discovery.MarkerStream.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import threading
from collections import Counter
from collections.abc import Callable, Collection, Generator, Iterator
from typing import Final, Generic, TypeVar

from httk_flow.protocol.discovery import MarkerStream
from httk_flow.protocol.fsio import FileSystem, fs
from httk_flow.protocol.handles import JobHandle
from httk_flow.protocol.names import NB_CLS_RE, SCAN_SEP, Marker, dir_class, marker_scan
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

#: names per text a count searches: a directory of a million names is searched in slices
SCAN_SLICE: Final = 8192
#: a directory with more names than this that are no markers is listed by entry: it holds
#: directories (a state kind's shards), whose types a listing by entry gives at once
STAT_MAX: Final = 32
#: directories pending before a split count forks a child for half of them: a fork (a
#: few milliseconds) is worth it only with many directories to share
SPLIT_MIN: Final = 16
_T = TypeVar("_T")
#: what a count makes of one directory's names (the directory, its names): its result,
#: and how many were markers
_Scan = Callable[[str, list[str]], tuple[_T, int]]


def _per_directory(
    ws: Workspace,
    state: State,
    scan: _Scan[_T],
    split: bool = False,
) -> Generator[_T, None, None]:
    """`scan` of the names of each directory under a state kind, a directory at a time (a
    directory that cannot be listed is passed by).

    Through the seam (a filesystem model installed for tests), each listing reads the
    entries' types: regular files are scanned, directories walked. On the plain filesystem
    only names are listed (about a third cheaper than an entry each); those of the grammar
    are taken for files, and only the others are looked at (lstat), to find subdirectories:
    a shard holds markers only, subdirectories are rare. The directory's link count (two,
    and one per subdirectory) then vouches that no subdirectory has a marker's name (a
    placement may be spelled so); where it does not add up (a filesystem that does not
    count subdirectories, a directory made or removed meanwhile), or where the others are
    many, the directory is listed by entry instead. (A symbolic link or other special file
    with a marker's name, which no actor makes, counts when listed by name.)

    `split`: once SPLIT_MIN directories are pending, a child process walks every other
    one (_Share), where the plain filesystem is read by a process of one thread."""
    plain = type(fs.impl) is FileSystem
    stack = [ws.state_dir(state)]
    share: _Share[_T] | None = None
    try:
        for found in _walk(stack, scan, plain):
            yield found
            if split and len(stack) >= SPLIT_MIN:
                split = False
                share = _Share.start(stack[1::2], scan) if plain and _may_fork() else None
                if share is not None:
                    del stack[1::2]  # in place: _walk pops from this list
        if share is not None:
            yield from share.finish(scan)
    finally:
        if share is not None:
            share.end()  # a walk left off: no child outlives it


def _walk(
    stack: list[str],
    scan: _Scan[_T],
    plain: bool,
    memory: MarkerStream | None = None,
    kept: Callable[[_T], bool] = bool,
    trust: bool = True,
    enter: Callable[[str], bool] | None = None,
) -> Iterator[_T]:
    """The directories of `stack` and those below them, popped from it (those below only
    if `enter` accepts their paths).

    `memory`: a remembering stream of the same kind whose filter `kept` answers for (what
    a directory's scan found holds a name it keeps). Directories it knows to hold nothing
    kept, unchanged since, are stat'ed, not listed (unless not `trust`: every one is
    listed); what is listed, it is told."""
    while stack:
        path = stack.pop()
        if trust and memory is not None and memory.settled(path):
            continue
        started = memory.now() if memory is not None else 0.0
        got = _by_name(path, scan) if plain else None
        if got is None:
            got = _by_entry(path, scan, plain)
        if got is not None:
            found, subdirs = got
            if enter is not None:
                subdirs = [d for d in subdirs if enter(d)]
            if memory is not None:
                memory.saw(path, started, kept=bool(subdirs) or kept(found))
            yield found
            stack.extend(subdirs)


def _may_fork() -> bool:
    # a child forked beside other threads could find a lock one of them held
    return hasattr(os, "fork") and threading.active_count() == 1


class _Share(Generic[_T]):
    """Directories walked by a forked child while this process walks the rest.

    Listing is kernel time a thread would give back, but CPython takes the interpreter
    lock again for every name listed (and the search holds it throughout): two threads
    barely overlap, two processes do. The child sends its results, pickled, through a
    pipe; whatever goes wrong there, this process walks the share itself."""

    def __init__(self, pid: int, fd: int, dirs: list[str]) -> None:
        self.pid, self.fd, self.dirs = pid, fd, dirs
        self.ended = False

    def end(self) -> None:
        """Close the pipe and reap the child (stopped first if it is still walking)."""
        if self.ended:
            return
        self.ended = True
        os.close(self.fd)
        with contextlib.suppress(OSError):
            if os.waitpid(self.pid, os.WNOHANG) == (0, 0):
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)

    @classmethod
    def start(cls, dirs: list[str], scan: _Scan[_T]) -> _Share[_T] | None:
        import pickle  # lazy: only a split count needs it

        r, w = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            return None
        if pid == 0:  # pragma: no cover - the child; its results are what is checked
            code = 1
            try:
                os.close(r)
                data = memoryview(pickle.dumps(list(_walk(list(dirs), scan, True))))
                while data:
                    data = data[os.write(w, data) :]
                code = 0
            finally:
                os._exit(code)  # never back into the caller's code
        os.close(w)
        return cls(pid, r, dirs)

    def finish(self, scan: _Scan[_T]) -> list[_T]:
        """The child's results, or the share walked here if they cannot be had."""
        import pickle

        parts = []
        try:
            while part := os.read(self.fd, 1 << 20):
                parts.append(part)
        except OSError:
            parts = []
        # the child has closed its end: it is exiting, reaping it does not wait long
        # (ChildProcessError: a handler of this process's own reaped it already)
        self.ended = True
        os.close(self.fd)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        try:
            # a pickle ends with its own stop code: one cut short does not load
            got: list[_T] = pickle.loads(b"".join(parts))
        except Exception:  # whatever a damaged pickle raises
            return list(_walk(list(self.dirs), scan, True))
        return got


def _by_name(path: str, scan: _Scan[_T]) -> tuple[_T, list[str]] | None:
    """A directory scanned by its names alone, if its link count vouches for it (None:
    list it by entry)."""
    try:
        links = os.lstat(path).st_nlink
        if links < 2:
            return None  # a filesystem that does not count subdirectories (btrfs)
        names = os.listdir(path)
    except OSError:
        return None
    found, markers = scan(path, names)
    subdirs = []
    if markers < len(names):
        others = _not_markers(names, markers)
        if len(others) > STAT_MAX:
            return None
        for name in others:
            sub = os.path.join(path, name)
            try:
                if stat.S_ISDIR(os.lstat(sub).st_mode):
                    subdirs.append(sub)
            except OSError:
                continue  # gone meanwhile
    if links != 2 + len(subdirs):
        return None
    return found, subdirs


def _not_markers(names: list[str], markers: int) -> list[str]:
    """The names that are no markers, `markers` of `names` being markers: those without a
    dot (a marker name holds several), unless they are not all; then every name the
    grammar refuses (one more search)."""
    dotless = [n for n in names if "." not in n]
    if markers + len(dotless) == len(names):
        return dotless
    scan = marker_scan()
    return [n for text, _ in _texts(names) for n in _leftover(scan.sub("", text))]


def _by_entry(path: str, scan: _Scan[_T], plain: bool) -> tuple[_T, list[str]] | None:
    """A directory scanned by entry (through the seam): its regular files' names, and its
    subdirectories."""
    try:
        it = fs.scandir(path)
    except OSError:
        return None
    try:
        entries = list(it)
    except OSError:
        return None
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
    # comprehensions, not a loop: no per-entry bytecode beyond these tests
    files = [e.name for e in entries if e.is_file(follow_symlinks=False)]
    if not plain:
        # a model's names are not checked by a kernel: one holding the separator or NUL
        # is no marker, and must not reach the scan
        files = [n for n in files if SCAN_SEP not in n and "\0" not in n]
    subdirs = []
    if len(files) < len(entries):
        subdirs = [e.path for e in entries if e.is_dir(follow_symlinks=False)]
    return scan(path, files)[0], subdirs


def _texts(names: list[str]) -> Iterator[tuple[str, int]]:
    """The texts marker_scan searches for `names`, a slice at a time, and each one's count
    of names."""
    for i in range(0, len(names), SCAN_SLICE):
        part = names[i : i + SCAN_SLICE]
        yield f"{SCAN_SEP}{SCAN_SEP.join(part)}{SCAN_SEP}", len(part)


def _leftover(text: str) -> list[str]:
    """The names of a text that a scan removed every marker from."""
    return text[1:-1].split(SCAN_SEP) if len(text) > 1 else []


def _count(_dir: str, names: list[str]) -> tuple[int, int]:
    scan = marker_scan()
    n = sum(scan.subn("", text)[1] for text, _ in _texts(names))
    return n, n


def count_markers(ws: Workspace, state: State, *, split: bool = False) -> int:
    """How many marker names of the grammar lie under a state kind (a plain directory
    walk): one search per directory (marker_scan), no call per name. `split`: half the
    directories walked by a child process (_per_directory), for a one-off look."""
    return sum(_per_directory(ws, state, _count, split))


def _tally_by(capture: str) -> _Scan[Counter[str]]:
    scan = marker_scan(capture)

    def tally(_dir: str, names: list[str]) -> tuple[Counter[str], int]:
        found: Counter[str] = Counter()
        for text, _ in _texts(names):
            got = scan.findall(text)
            # most names spell no such field: "" is counted at C speed, by identity (and
            # only if found: a count of 0 would be an entry all the same)
            empty = got.count("")
            if empty:
                found[""] += empty
            found.update(filter(None, got))
        return found, found.total()

    return tally


def _tally(ws: Workspace, state: State, capture: str, split: bool) -> Counter[str]:
    """Markers under a state kind counted by what the group `capture` of marker_scan
    spells in each ("" where it is empty)."""
    total: Counter[str] = Counter()
    for found in _per_directory(ws, state, _tally_by(capture), split):
        total.update(found)
    return total


def tally_markers(
    ws: Workspace, state: State, *, split: bool = False
) -> Counter[tuple[str | None, str | None]]:
    """Markers of the grammar under a state kind, counted by (not-before field, class
    field) as their names spell them (None: absent): counts by class and backoff with one
    search per directory and no marker built."""
    tally: Counter[tuple[str | None, str | None]] = Counter()
    for fields, n in _tally(ws, state, "nb_cls", split).items():
        m = NB_CLS_RE.fullmatch(fields)
        assert m is not None, fields  # the scan matched it
        tally[m["nb"], m["cls"]] += n
    return tally


def count_after(ws: Workspace, state: State, *, split: bool = False) -> tuple[int, int]:
    """(markers, those whose name carries the `.a` field: waiting for dependencies) under
    a state kind, by name, with one search per directory."""
    found = _tally(ws, state, "aft", split)
    return found.total(), found[".a"]


def _grammar_count(names: list[str], *, unclassed: bool = False, joined: str = "") -> int:
    """How many of `names` are markers of the grammar (of the default class only, if
    `unclassed`): one search a slice (a name holding a class field may be a directory's).
    `joined`: the names joined by SCAN_SEP already, searched whole when one slice would
    hold them all."""
    scan = marker_scan(None, unclassed=unclassed)
    if joined and len(names) <= SCAN_SLICE:
        return scan.subn("", f"{SCAN_SEP}{joined}{SCAN_SEP}")[1]
    return sum(scan.subn("", text)[1] for text, _ in _texts(names))


def markers_wanted(
    ws: Workspace,
    state: State,
    prefixes: tuple[str, ...],
    wants: Callable[[str], bool],
    foreign: Callable[[], Collection[str]],
    memory: MarkerStream | None = None,
    trust: bool = True,
) -> Iterator[JobHandle]:
    """The markers of a state kind under `prefixes` whose names `wants` accepts (see
    names.marker_service), for a manager's look at what is left that it serves.

    `foreign`: service classes known not to be served ("": the default). A directory
    whose names are all markers of them is passed by with no call per name (a count of
    each class field in the names joined, then one or two searches of them), so 100,000
    ready jobs of another pool cost about what listing them costs.

    `memory`: a remembering stream of the same kind and filter (_walk), so looks made
    often (an idle `flow run --idle N`) soon cost a stat per directory; `trust`: False
    lists every directory all the same (a look that decides to stop: a shared
    filesystem's client may cache a directory's attributes, and not see a rename into
    it, for a minute)."""
    cut = len(ws.state_dir(state)) + 1

    def enter(path: str) -> bool:
        """Not a class directory of a class known not to be served (never listed), nor
        a directory inside a class directory (which holds markers only)."""
        parent, _, name = path.rpartition("/")
        if dir_class(parent.rpartition("/")[2]) is not None:
            return False
        cls = dir_class(name)
        return cls is None or cls not in foreign()

    def scan(path: str, names: list[str]) -> tuple[tuple[list[JobHandle], int], int]:
        """((the markers `wants` accepts, how many names it accepted), markers)"""
        classes = foreign()
        n = len(names)
        if classes and n:
            # among names of the grammar these counts are exact (a marker holds one class
            # field at most, and its key, other fields and ref hold no ".c<id>."), so the
            # grammar's search of every name comes last: a stray name may hold two such
            # fields, a directory's name (a placement's) one
            text = SCAN_SEP.join(names)
            named = sum(text.count(f".c{c}.") for c in classes if c)
            if named == n or ("" in classes and named < n):
                default = _grammar_count(names, unclassed=True, joined=text) if named < n else 0
                if named + default == n and _grammar_count(names, joined=text) == n:
                    return ([], 0), n
        placement, cls_dir = path[cut:], ""
        head, _, last = placement.rpartition("/")
        if dir_class(last) is not None:
            placement, cls_dir = head, last
        found: list[JobHandle] = []
        accepted = 0
        others: list[str] = []
        for name in names:
            if wants(name):
                accepted += 1
                marker = Marker.parse_or_none(name)
                # one outside the directory its class places it in is the stream's to
                # report; no manager can move it, so it is not work left
                if marker is not None and ws.class_dir_of(state, marker.service) == cls_dir:
                    found.append(JobHandle(state, placement, marker))
            else:
                others.append(name)
        # what `wants` refuses is a marker of a class not ours, or no marker at all (a
        # subdirectory, whose name a placement may spell much as a marker's)
        return (found, accepted), len(found) + (_grammar_count(others) if others else 0)

    stack = [ws.state_dir(state, p) for p in prefixes or ("",)]
    plain = type(fs.impl) is FileSystem

    def kept(got: tuple[list[JobHandle], int]) -> bool:
        return got[1] > 0  # a name the filter accepts

    for found, _ in _walk(stack, scan, plain, memory, kept, trust, enter):
        yield from found
