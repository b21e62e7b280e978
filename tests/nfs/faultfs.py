"""FileSystem subclasses that model what a process sees of a shared (NFS) filesystem.

These machines cannot mount NFS, so its hazards are injected at the one seam every
protocol rename, listing and read goes through (httk_flow.protocol.fsio.fs):

- LateNames: a name created by someone else appears in our listings only some time after
  we first could have seen it (directory attribute caching);
- LingeringNames: a name removed (renamed away) stays in our listings, and exists() keeps
  answering yes, for a while (stale dentries);
- StaleHandles: the first read of each file fails with ESTALE (the file was replaced under
  our cached handle);
- LyingRenames: a rename happens, then reports an error (a retransmitted RPC whose first
  copy succeeded answers ENOENT);
- StaleDirStats: a directory's attributes stay as first read for a while (attribute
  caching), so its mtime hides a rename into it.

Each model is cooperative (super()), so they combine: `class Both(LateNames, LyingRenames)`.
A model affects only the process it is installed in: multi-process tests start managers
through nfs_flow.py, which installs one from $FLOW_TEST_NFS before running the CLI.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from httk_flow.protocol.fsio import FileSystem

Clock = Callable[[], float]


class LateNames(FileSystem):
    """A directory's first listing is the truth; a name that shows up in a later listing
    is hidden until `late` seconds after that listing first returned it.

    `late_dirs` gives some directories (by path suffix) a delay of their own: a client
    caches each directory's attributes on its own timer, and one that rarely changes (the
    managers' directory) is trusted longest."""

    def __init__(
        self,
        *args: object,
        late: float = 1.0,
        late_dirs: dict[str, float] | None = None,
        clock: Clock = time.monotonic,
        **kw: object,
    ):
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.late = late
        self.late_dirs = dict(late_dirs or {})
        self._clock = clock
        self._lock = threading.Lock()
        self._first_seen: dict[str, dict[str, float]] = {}
        self.hidden = 0  # names held back so far (a test can see the model at work)

    def caches_attributes(self, path: str) -> bool:
        return True  # as an NFS client does

    def scandir(self, path: str) -> Iterator[os.DirEntry[str]]:
        entries = list(super().scandir(path))
        now = self._clock()
        late = next(
            (t for suffix, t in self.late_dirs.items() if path.rstrip(os.sep).endswith(suffix)),
            self.late,
        )
        with self._lock:
            seen = self._first_seen.get(path)
            if seen is None:
                self._first_seen[path] = {e.name: -1e18 for e in entries}
                return iter(entries)
            out = []
            for e in entries:
                first = seen.setdefault(e.name, now)
                if now - first >= late:
                    out.append(e)
                else:
                    self.hidden += 1
            return iter(out)


@dataclass
class Ghost:
    """A DirEntry of a name that is no longer there."""

    name: str
    path: str

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        return False

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        return True

    def is_symlink(self) -> bool:
        return False

    def inode(self) -> int:
        return 0

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        raise FileNotFoundError(errno.ENOENT, "a ghost", self.path)


class LingeringNames(FileSystem):
    """A file name listed in the last `linger` seconds is still listed, and still exists()
    to us, after it is gone."""

    def __init__(
        self, *args: object, linger: float = 1.0, clock: Clock = time.monotonic, **kw: object
    ):
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.linger = linger
        self._clock = clock
        self._lock = threading.Lock()
        self._listed: dict[str, dict[str, float]] = {}  # dir -> file name -> last listed
        self.ghosts = 0

    def scandir(self, path: str) -> Iterator[os.DirEntry[str]]:
        entries = list(super().scandir(path))
        now = self._clock()
        with self._lock:
            listed = self._listed.setdefault(path, {})
            present = set()
            for e in entries:
                present.add(e.name)
                if e.is_file(follow_symlinks=False):
                    listed[e.name] = now
            out: list[os.DirEntry[str] | Ghost] = list(entries)
            for name, when in list(listed.items()):
                if name in present:
                    continue
                if now - when <= self.linger:
                    out.append(Ghost(name, os.path.join(path, name)))
                    self.ghosts += 1
                else:
                    del listed[name]
        return iter(out)  # type: ignore[arg-type]

    def exists(self, path: str) -> bool:
        if super().exists(path):
            return True
        d, name = os.path.split(path)
        with self._lock:
            when = self._listed.get(d, {}).get(name)
        return when is not None and self._clock() - when <= self.linger


class StaleHandles(FileSystem):
    """The first read_bytes of each path fails with ESTALE; later reads succeed."""

    def __init__(self, *args: object, **kw: object):
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self._lock = threading.Lock()
        self._stale_done: set[str] = set()
        self.stale = 0

    def read_bytes(self, path: str, limit: int) -> bytes:
        with self._lock:
            first = path not in self._stale_done
            self._stale_done.add(path)
        if first:
            self.stale += 1
            raise OSError(errno.ESTALE, os.strerror(errno.ESTALE), path)
        return super().read_bytes(path, limit)


class LyingRenames(FileSystem):
    """Renames that `applies(src, dst)` selects happen, then report ENOENT."""

    def __init__(
        self,
        *args: object,
        applies: Callable[[str, str], bool] = lambda src, dst: True,
        **kw: object,
    ):
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.applies = applies
        self.lies = 0
        self._lock = threading.Lock()

    def rename(self, src: str, dst: str) -> None:
        super().rename(src, dst)
        if self.applies(src, dst):
            with self._lock:
                self.lies += 1
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), src)


def markers_only(src: str, dst: str) -> bool:
    """Marker renames (the verified transition) only: .flow/state/ on both sides."""
    sep = os.sep
    return f"{sep}.flow{sep}state{sep}" in src and f"{sep}.flow{sep}state{sep}" in dst


@dataclass
class Recorder(FileSystem):
    """Plain operations, remembering every directory listed, removed and made (to see
    what uses the seam)."""

    listed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    made: list[str] = field(default_factory=list)

    def rmdir(self, path: str) -> None:
        self.removed.append(path)
        super().rmdir(path)

    def makedirs(self, path: str) -> bool:
        self.made.append(path)
        return super().makedirs(path)

    def scandir(self, path: str) -> Iterator[os.DirEntry[str]]:
        self.listed.append(path)
        return super().scandir(path)


class StaleDirStats(FileSystem):
    """A directory's attributes as first read, for `hold` seconds: a client that caches
    them (NFS's acdirmin/acdirmax, up to a minute by default) sees no change of its mtime,
    a rename into it included, until they expire. `stale` counts the answers that were."""

    def __init__(
        self, *args: object, hold: float = 60.0, clock: Clock = time.monotonic, **kw: object
    ):
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.hold = hold
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: dict[str, tuple[float, os.stat_result]] = {}
        self.stale = 0

    def caches_attributes(self, path: str) -> bool:
        return True  # as an NFS client does

    def lstat(self, path: str) -> os.stat_result:
        st = super().lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            return st
        now = self._clock()
        with self._lock:
            got = self._cached.get(path)
            if got is None or now - got[0] >= self.hold:
                self._cached[path] = (now, st)
                return st
            if got[1].st_mtime_ns != st.st_mtime_ns:
                self.stale += 1
            return got[1]
