"""The one seam between the protocol and the filesystem.

Every rename, publish, directory listing and read of protocol files goes through `fs`,
so tests can swap in a FileSystem that models NFS hazards (late names, ESTALE, lying
renames).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
from collections.abc import Callable, Iterator
from typing import Final

from httk_flow.errors import UnsafePath
from httk_flow.protocol import mounts

#: errors a reader retries: the file was replaced under an open handle (NFS ESTALE)
RETRYABLE_READ_ERRNOS: Final = frozenset({errno.ESTALE})
#: how many times a read through `fs` opens a file before an ESTALE is final
READ_ATTEMPTS: Final = 4
_UID = os.getuid()


class FileSystem:
    """Plain POSIX operations; subclasses inject faults for tests."""

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def makedirs(self, path: str) -> bool:
        """mkdir -p; True when this call made `path` itself (False: something is there)."""
        try:
            # the parent is there nearly always (a state kind, a placement): one mkdir,
            # where os.makedirs first stats the parent
            os.mkdir(path)
        except FileExistsError:
            return False
        except FileNotFoundError:
            try:
                os.makedirs(path)
            except FileExistsError:
                return False
        return True

    def lstat(self, path: str) -> os.stat_result:
        """The entry's own attributes (a link is not followed): what a client may cache."""
        return os.lstat(path)

    def caches_attributes(self, path: str) -> bool:
        """Whether a directory's attributes read here may lag a rename into it made on
        another host (mounts.caches_attributes)."""
        return mounts.caches_attributes(path)

    def scandir(self, path: str) -> Iterator[os.DirEntry[str]]:
        """The directory's entries, as os.scandir gives them (DirEntry, with close()).

        Not a generator: a missing directory raises here, at the call, as os.scandir does,
        and the hot walks pay no extra frame per entry."""
        return os.scandir(path)

    def read_bytes(self, path: str, limit: int) -> bytes:
        """Read a regular file we own, refusing symlinks; at most `limit` bytes.

        One attempt: ESTALE is raised to the caller. Reads through `fs` retry it (the one
        retry loop, so a fault model's ESTALE is retried like a real one)."""
        try:
            # O_NONBLOCK: a FIFO planted in place of a file must not hang the reader
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise UnsafePath("is a symbolic link; refusing to follow it", obj=path) from e
            raise
        try:
            st = os.fstat(fd)
            check_owned(st, path)
            if not stat.S_ISREG(st.st_mode):
                raise UnsafePath("is not a regular file", obj=path)
            if st.st_size > limit:
                raise UnsafePath(f"is larger than {limit} bytes", obj=path)
            return _read_to_end(fd, st.st_size, limit)
        finally:
            os.close(fd)


def _read_to_end(fd: int, size: int, limit: int) -> bytes:
    """At most limit + 1 bytes of fd, asking first for the size fstat gave (and one more):
    a buffer of `limit` is a fresh mmap, mremap and munmap per read once over malloc's
    threshold (1 MiB outcomes and job.json), three system calls more than the read."""
    want = min(size, limit) + 1
    data = os.read(fd, want)
    if len(data) < want:
        return data  # the end of the file: the common case, one read
    chunks = [data]
    got = len(data)
    while got <= limit:  # it grew since the fstat: read on to the end or past the limit
        more = os.read(fd, limit + 1 - got)
        if not more:
            break
        chunks.append(more)
        got += len(more)
    return b"".join(chunks)


def check_owned(st: os.stat_result, path: str) -> None:
    # root reads everyone's files; a user never trusts an entry planted by another user
    if _UID != 0 and st.st_uid != _UID:
        raise UnsafePath(f"is owned by uid {st.st_uid}, not by you", obj=path)


class _Installed(FileSystem):
    """The `fs` every module binds at import; set_filesystem swaps what it forwards to."""

    def __init__(self, impl: FileSystem) -> None:
        self.impl = impl

    def rename(self, src: str, dst: str) -> None:
        self.impl.rename(src, dst)

    def exists(self, path: str) -> bool:
        return self.impl.exists(path)

    def rmdir(self, path: str) -> None:
        self.impl.rmdir(path)

    def makedirs(self, path: str) -> bool:
        return self.impl.makedirs(path)

    def lstat(self, path: str) -> os.stat_result:
        return self.impl.lstat(path)

    def caches_attributes(self, path: str) -> bool:
        return self.impl.caches_attributes(path)

    def scandir(self, path: str) -> Iterator[os.DirEntry[str]]:
        return self.impl.scandir(path)

    def read_bytes(self, path: str, limit: int) -> bytes:
        # a file replaced under a reader on NFS answers ESTALE (at the open, the stat or the
        # read): open it again, a bounded number of times, rather than take it for damage
        for attempt in range(READ_ATTEMPTS):
            try:
                return self.impl.read_bytes(path, limit)
            except OSError as e:
                if e.errno not in RETRYABLE_READ_ERRNOS or attempt == READ_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")


# modules do `from httk_flow.protocol.fsio import fs`, so this object must stay the same one
fs: Final = _Installed(FileSystem())


def set_filesystem(new: FileSystem) -> FileSystem:
    """Install a filesystem (tests); returns the previous one."""
    if isinstance(new, _Installed):
        new = new.impl
    old, fs.impl = fs.impl, new
    return old


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class GroupSync:
    """Durability for a batch: the files and directories written are noted, and made
    durable together by flush() (group commit: one syncfs(2) of the filesystem holding
    `anchor` where Linux has it, else an fsync of each, after all were written, so that
    the journal commits them together rather than one commit per file)."""

    def __init__(self, anchor: str) -> None:
        self.anchor = anchor
        #: syncfs flushes everything: nothing needs to be noted one by one
        self._whole = _syncfs_call() is not None
        self._pending = False
        self.files: list[str] = []
        self.dirs: set[str] = set()

    def file(self, path: str) -> None:
        self._pending = True
        if not self._whole:
            self.files.append(path)

    def dir(self, path: str) -> None:
        self._pending = True
        if not self._whole:
            self.dirs.add(path)

    def tree(self, top: str) -> None:
        """Every file and directory below `top` (a copied input tree)."""
        self._pending = True
        if not self._whole:
            for d, _dirs, files in os.walk(top):
                self.dirs.add(d)
                self.files += [os.path.join(d, f) for f in files]

    def flush(self) -> None:
        """Everything noted is on stable storage when this returns (or it raises)."""
        if not self._pending:
            return
        call = _syncfs_call()
        if call is not None:
            fd = os.open(self.anchor, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                if call(fd) != 0:
                    import ctypes  # loaded already: _syncfs_call found the call through it

                    e = ctypes.get_errno()
                    raise OSError(e, os.strerror(e), self.anchor)
            finally:
                os.close(fd)
        else:
            for path in self.files:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            for d in self.dirs:
                fsync_dir(d)
        self._pending, self.files, self.dirs = False, [], set()


@functools.cache
def _syncfs_call() -> Callable[[int], int] | None:
    """libc's syncfs(2), looked up once; None where there is none (or HTTK_FLOW_NO_SYNCFS
    is set: the tests run the fallback too)."""
    if os.environ.get("HTTK_FLOW_NO_SYNCFS"):
        return None
    import ctypes  # only durable workspaces pay for it

    call: Callable[[int], int] | None = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)
    return call


def write_file(path: str, data: bytes, *, durable: bool, mode: int = 0o644) -> None:
    """Create `path` (which must not exist) with `data`; fsync it when durable."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes, *, durable: bool, tmp_dir: str | None = None) -> None:
    """Publish `data` at `path` by writing a sibling temporary file and renaming it."""
    d = tmp_dir or os.path.dirname(path)
    tmp = os.path.join(d, f".{os.path.basename(path)}.{os.getpid()}.{os.urandom(4).hex()}")
    try:
        write_file(tmp, data, durable=durable)
        try:
            fs.rename(tmp, path)
        except OSError:
            # a rename that happened although it reported an error (NFS retransmit)
            if os.path.lexists(tmp) or not os.path.lexists(path):
                raise
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(os.path.dirname(path))


@functools.lru_cache(maxsize=4096)
def real_dir(path: str) -> str:
    """realpath of a directory that is there, resolved once per process: a plain directory
    (no link) is its parent's real path and its name, so a new shard costs one lstat where
    realpath costs one per path component. A link, or anything else, is resolved whole."""
    parent, _, name = path.rpartition("/")
    if parent and name not in ("", ".", ".."):
        try:
            st = os.lstat(path)
        except OSError:
            return os.path.realpath(path)
        if stat.S_ISDIR(st.st_mode):
            return os.path.join(real_dir(parent), name)
    return os.path.realpath(path)


def makedirs(path: str) -> None:
    fs.makedirs(path)  # there already is as good as made


#: renames tried into a directory retired again and again (protocol.md §4); a retirer
#: spinning on it with no size floor wins about one try in four here
RECREATE_TRIES: Final = 32


def rename_recreating(
    src: str, dst: str, on_made: Callable[[str, bool], object] | None = None
) -> None:
    """rename(src, dst), making dst's directory when it is missing and trying again.

    A state shard directory may be removed once empty (protocol.md §1), also between our
    making it and our rename: so a bounded number of times. ENOENT with the source gone
    (another actor moved it), and any other error, is the caller's to resolve.
    `on_made(directory, by_us)` is told of the directory made again before we rename into
    it, by this call (a plain directory) or by someone else (to be checked)."""
    dst_dir = os.path.dirname(dst)
    for attempt in range(RECREATE_TRIES):
        try:
            fs.rename(src, dst)
            return
        except FileNotFoundError:
            if attempt == RECREATE_TRIES - 1 or not fs.exists(src):
                raise
        by_us = fs.makedirs(dst_dir)
        if on_made is not None:
            on_made(dst_dir, by_us)


def retire_dir(path: str, min_bytes: int, st: os.stat_result | None = None) -> bool:
    """Remove `path` if it is an empty directory of at least `min_bytes` (ext4 never
    shrinks a directory, so every later listing would reread its empty blocks). rmdir
    refuses a directory that is not empty, so a name renamed in meanwhile is never lost;
    a renamer that finds the directory gone makes it again (rename_recreating). `st`: its
    lstat, when the caller has just taken it."""
    try:
        if (st or os.lstat(path)).st_size < min_bytes:
            return False
        fs.rmdir(path)
    except OSError:
        return False  # not empty again, gone already, or not ours to remove
    return True
