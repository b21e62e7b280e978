"""Bounded, streaming discovery of markers: a resumable walk, never the whole tree at once.

Each call visits at most `budget` directory entries and resumes where the last call
stopped; a full cycle visits every placement. Nothing is listed whole or sorted.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from httk_flow.protocol.fsio import fs, retire_dir
from httk_flow.protocol.handles import JobHandle
from httk_flow.protocol.names import Marker, dir_class
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

#: how many entries pass between two calls of the heartbeat hook
HEARTBEAT_EVERY = 512
#: an empty state directory at least this large is removed by a retiring walk: ext4 never
#: shrinks a directory, and one that held thousands of markers is reread at every cycle
RETIRE_MIN_BYTES: Final = 16 * 1024


#: a directory's identity and change times: any name renamed in or out changes them
_Signature = tuple[int, int, int]
#: seconds between seeing a directory empty and confirming it, so that a name renamed in
#: within the same timestamp tick as our first look (which leaves mtime alone) is seen
SETTLE: Final = 1.0
#: every this many cycles a remembering walk lists every directory again (a clock that
#: stepped back, or a filesystem whose times do not move, delays a marker this long at most)
RELIST_EVERY: Final = 16
#: directories remembered per stream (a million child placements must not fill memory)
REMEMBER_MAX: Final = 65536


def _signature(st: os.stat_result) -> _Signature:
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


class _QuietDirs:
    """Directories below a root seen empty twice, SETTLE apart, with the same signature:
    the next cycles stat them (one syscall) instead of listing them (five), until their
    signature changes. Renaming a name into a directory changes its mtime and ctime.

    Under a names filter "empty" means holding nothing the stream keeps (no subdirectory,
    no name the filter accepts): a shard full of other pools' markers is stat'ed too."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        #: path -> (signature, when first seen empty with it, confirmed)
        self._seen: dict[str, tuple[_Signature, float, bool]] = {}

    def unchanged(self, path: str) -> bool:
        """Whether `path` is a confirmed empty directory still as it was (no listing needed)."""
        rec = self._seen.get(path)
        if rec is None or not rec[2]:
            return False
        try:
            st = fs.lstat(path)
        except OSError:
            del self._seen[path]
            return False
        if _signature(st) == rec[0]:
            return True
        del self._seen[path]
        return False

    def empty(self, path: str, listed_at: float, retire: bool) -> None:
        """`path` was listed (from `listed_at` on) and held nothing kept (`retire`: and
        nothing at all)."""
        try:
            st = fs.lstat(path)
        except OSError:
            self._seen.pop(path, None)
            return
        if retire and retire_dir(path, RETIRE_MIN_BYTES, st):
            self._seen.pop(path, None)
            return
        sig = _signature(st)
        rec = self._seen.get(path)
        if rec is not None and rec[0] == sig:
            if not rec[2] and listed_at - rec[1] >= SETTLE:
                self._seen[path] = (sig, rec[1], True)
        elif rec is not None or len(self._seen) < REMEMBER_MAX:
            self._seen[path] = (sig, self._clock(), False)

    def forget(self, path: str) -> None:
        self._seen.pop(path, None)


@dataclass
class _Walk:
    """A depth-first walk of one placement root with its open directory iterators."""

    root: str  # absolute directory of the state kind + prefix
    placement: str  # placement of `root`
    #: [placement, open listing, entries it gave so far, path, when listed, entries kept,
    #: class directory ("" for a placement's own)] from the root
    stack: list[list[Any]] = field(default_factory=list)
    finished: int = 0
    started: float = 0.0  # when the current cycle began
    found: int = 0  # markers found in the current cycle
    rest_until: float = 0.0  # no new cycle before this (monotonic seconds)

    def close(self) -> None:
        for frame in self.stack:
            _close(frame[1])
        self.stack.clear()


class MarkerStream:
    """Markers of one state kind under some placement prefixes, a bounded slice per call."""

    def __init__(
        self,
        ws: Workspace,
        state: State,
        prefixes: tuple[str, ...] = (),
        *,
        on_bad: Callable[[str, str], None] | None = None,
        rest: float = 0.0,
        rest_always: bool = False,
        clock: Callable[[], float] = time.monotonic,
        names: Callable[[str], bool] | None = None,
        retire: bool = False,
        remember: bool = False,
        classes: Callable[[str], bool] | None = None,
        on_misplaced: Callable[[str, JobHandle], None] | None = None,
    ) -> None:
        """`rest`: seconds between the starts of two cycles when a cycle found nothing
        (or always, with `rest_always`), so an idle kind costs nothing between cycles.

        `names`: only marker names it accepts are parsed and yielded (and count as found),
        judged by the name alone (names.marker_service), so other pools' markers cost a
        string search each. `retire`: directories below a root found empty and large are
        removed (fsio.retire_dir, protocol.md §1). `remember`: directories below a root
        found empty and unchanged are stat'ed instead of listed (_QuietDirs), all but every
        RELIST_EVERY-th cycle: an idle manager's scans cost one syscall per directory. With
        `names`, a directory whose names it all refuses counts as empty there.

        `classes`: a class directory (protocol.md §1) is entered only if it accepts the
        class; one it refuses is passed by unlisted, and counts for nothing.
        `on_misplaced(path, handle)`: a marker found outside the directory its state and
        class place it in (else reported to `on_bad`); it is not yielded, since every
        transition renames a marker from where its state and class place it."""
        self._quiet = _QuietDirs(clock) if remember else None
        self._names = names
        self._classes = classes
        self._on_misplaced = on_misplaced
        self._retire = retire
        self.ws = ws
        self._rest = rest
        self._rest_always = rest_always
        self._clock = clock
        self.state = state
        self._walks = [_Walk(ws.state_dir(state, p), p) for p in (prefixes or ("",))]
        self._turn = 0
        self._on_bad = on_bad

    def next_batch(
        self, budget: int, heartbeat: Callable[[], None] | None = None
    ) -> list[JobHandle]:
        """Up to `budget` entries' worth of markers; resumes next call where this one stopped."""
        out: list[JobHandle] = []
        visited, k = 0, len(self._walks)
        for i in range(k):
            walk = self._walks[self._turn]
            self._turn = (self._turn + 1) % k
            share = max(1, (budget - visited) // (k - i))
            n, finished = self._step(walk, share, out, heartbeat)
            visited += n
            if finished:
                walk.finished += 1
            if visited >= budget:
                break
        return out

    def settled(self, path: str) -> bool:
        """Whether a directory is known to hold nothing this stream keeps and is unchanged
        since (one stat): what a look with the same filter need not list."""
        return self._quiet is not None and self._quiet.unchanged(path)

    def saw(self, path: str, listed_at: float, kept: bool) -> None:
        """A look with this stream's filter listed a directory (from `listed_at` on, by
        this stream's clock): remembered as if the stream had (the stream itself never
        asks of its roots, which it lists each cycle)."""
        if self._quiet is None:
            return
        if kept:
            self._quiet.forget(path)
        else:
            self._quiet.empty(path, listed_at, retire=False)

    def now(self) -> float:
        return self._clock()

    @property
    def cycles(self) -> int:
        """Full walks completed by every root (a new stream has done 0)."""
        return min(w.finished for w in self._walks)

    def _step(
        self,
        walk: _Walk,
        budget: int,
        out: list[JobHandle],
        heartbeat: Callable[[], None] | None,
    ) -> tuple[int, bool]:
        """Advance one walk by up to `budget` entries; (entries visited, walk finished)."""
        if not walk.stack:
            now = self._clock()
            if now < walk.rest_until:
                return 0, False
            it = _scandir(walk.root)
            if it is None:
                walk.rest_until = now + self._rest
                return 0, True
            walk.stack.append([walk.placement, it, 0, walk.root, now, 0, ""])
            walk.started, walk.found = now, 0
        visited = 0
        wanted, classes = self._names, self._classes
        quiet = self._quiet
        skip_quiet = walk.finished % RELIST_EVERY != RELIST_EVERY - 1
        while walk.stack and visited < budget:
            frame = walk.stack[-1]
            placement, it = frame[0], frame[1]
            entry = next(it, None)
            if entry is None:
                walk.stack.pop()
                # frame[2]: entries listed; frame[5]: of them kept (not refused by name)
                if not frame[5] and walk.stack:
                    retire = self._retire and not frame[2]
                    if quiet is not None:
                        _close(it)
                        quiet.empty(frame[3], frame[4], retire)
                    elif retire:
                        _close(it)
                        retire_dir(frame[3], RETIRE_MIN_BYTES)
                elif quiet is not None and frame[5]:
                    quiet.forget(frame[3])
                continue
            frame[2] += 1
            visited += 1
            if heartbeat is not None and visited % HEARTBEAT_EVERY == 0:
                heartbeat()
            name = entry.name
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if is_dir:
                cls = dir_class(name)
                if frame[6]:  # a class directory holds markers only
                    if self._on_bad is not None:
                        self._on_bad(entry.path, "is a directory inside a class directory")
                    continue
                if cls is not None and classes is not None and not classes(cls):
                    continue  # another pool's ready jobs: never listed
                frame[5] += 1
                if skip_quiet and quiet is not None and quiet.unchanged(entry.path):
                    continue
                try:
                    sub = _scandir(entry.path)
                except OSError as e:
                    # a directory we may not read (another user's) must not stop the walk
                    if self._on_bad is not None:
                        self._on_bad(entry.path, f"cannot be listed ({e.strerror})")
                    continue
                if sub is not None:
                    if cls is not None:  # a class directory: its placement's ready jobs
                        below = placement
                    else:
                        below = f"{placement}/{name}" if placement else name
                    walk.stack.append(
                        [
                            below,
                            sub,
                            0,
                            entry.path,
                            self._clock() if quiet is not None else 0.0,
                            0,
                            name if cls is not None else "",
                        ]
                    )
                continue
            if wanted is not None and not wanted(name):
                continue
            frame[5] += 1
            marker = Marker.parse_or_none(name)
            if marker is None or not entry.is_file(follow_symlinks=False):
                if self._on_bad is not None and not name.startswith("."):
                    self._on_bad(entry.path, "is not a marker of the grammar (or not a file)")
                continue
            handle = JobHandle(self.state, placement, marker)
            if self.ws.class_dir_of(self.state, marker.service) != frame[6]:
                self._misplaced(entry.path, handle)
                continue
            out.append(handle)
            walk.found += 1
        if not walk.stack and (self._rest_always or walk.found == 0):
            walk.rest_until = walk.started + self._rest
        return visited, not walk.stack

    def _misplaced(self, path: str, handle: JobHandle) -> None:
        if self._on_misplaced is not None:
            self._on_misplaced(path, handle)
        elif self._on_bad is not None:
            self._on_bad(
                path,
                f"lies outside the directory its state and class place it in "
                f"({handle.path(self.ws)}); run `flow fsck --repair`",
            )

    def close(self) -> None:
        for w in self._walks:
            w.close()


def _scandir(path: str) -> Iterator[os.DirEntry[str]] | None:
    # through the seam, so a filesystem model installed for tests sees the marker walks
    try:
        return fs.scandir(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _close(it: Iterator[os.DirEntry[str]]) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()


def walk_all(
    ws: Workspace,
    state: State,
    prefixes: tuple[str, ...] = (),
    *,
    names: Callable[[str], bool] | None = None,
    classes: Callable[[str], bool] | None = None,
    misplaced: list[JobHandle] | None = None,
) -> Iterator[JobHandle]:
    """Every marker of a kind (of those whose names `names` accepts, in the class
    directories whose class `classes` accepts), streamed in bounded slices (for read-side
    commands). `misplaced`: markers outside the directory their class places them in
    (§1) are added to it (else passed by)."""
    on_misplaced = None if misplaced is None else (lambda _p, h: misplaced.append(h))
    # one stream per prefix: a shared stream restarts a short prefix while a long one
    # is still walking, and would yield the short one's markers again
    for prefix in prefixes or ("",):
        stream = MarkerStream(
            ws, state, (prefix,), names=names, classes=classes, on_misplaced=on_misplaced
        )
        try:
            while stream.cycles < 1:
                yield from stream.next_batch(4096)
        finally:
            stream.close()


def any_marker(
    ws: Workspace,
    state: State,
    prefixes: tuple[str, ...] = (),
    *,
    names: Callable[[str], bool] | None = None,
) -> bool:
    """Whether at least one marker (that `names` accepts) lies under a state kind (stops
    at the first)."""
    return any(True for _ in walk_all(ws, state, prefixes, names=names))


def markers_of_placement(
    ws: Workspace,
    placement: str,
    states: Iterable[State] = tuple(State),
    *,
    key: str | None = None,
    keys: Collection[str] | None = None,
) -> Iterator[tuple[State, Marker]]:
    """(state, marker) of every marker name directly in one placement (only job `key`'s,
    or those of `keys`, if given), one listing per state kind (in `states` order). A kind
    whose directory cannot be listed is skipped. A name is parsed only when its key (all
    before the first dot: a key holds none) is wanted. The class directories of the
    placement's ready jobs are listed too; a marker is taken only where its state and
    class place it (a transition renames it from there)."""
    prefix = key + "." if key is not None else ""
    for st in states:
        base = ws.state_dir(st, placement)
        todo = [("", base)]
        while todo:
            cls_dir, path = todo.pop()
            try:
                # through the seam, so an NFS model sees (and can delay) these listings
                # too; read whole, so an error while listing skips the directory rather
                # than half of it
                entries = [e.name for e in fs.scandir(path)]
            except OSError:
                continue
            for name in entries:
                if dir_class(name) is not None:
                    if not cls_dir:
                        todo.append((name, f"{base}/{name}"))
                    continue
                if not name.startswith(prefix):
                    continue  # cheaper than parsing every other job's name
                if keys is not None and name.partition(".")[0] not in keys:
                    continue
                m = Marker.parse_or_none(name)
                if m is None or (key is not None and m.key != key):
                    continue
                if ws.class_dir_of(st, m.service) == cls_dir:
                    yield st, m
