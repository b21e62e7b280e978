"""The bundle store: a program's directory tree kept once, named by its tree digest.

`flow submit --bundle DIR DIR/run.sh` stores DIR under `.flow/bundles/<digest>/` and runs
run.sh inside that copy, so the files beside it (`source "$(dirname "$0")/lib.sh"`, a
Python module next to the script) are found. The digest covers relative paths, the
executable bit and contents (docs/protocol.md §6), so an identical tree is stored once.

A symbolic link is stored as the regular file it names when that file lies inside DIR;
any other link (out of DIR, to a directory, to nothing) is refused, as is every file that
is not regular. `__pycache__` directories are left out: they are Python's own caches.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from httk_flow.errors import UsageError
from httk_flow.protocol import layout
from httk_flow.protocol.fsio import fs, fsync_dir
from httk_flow.protocol.inputs import human_size
from httk_flow.protocol.jobspec import Program
from httk_flow.protocol.shebang import LINE_MAX, check_runnable
from httk_flow.protocol.workspace import Workspace

#: a bundle may hold this much unless the submitter raises it (--bundle-max)
DEFAULT_BUNDLE_MAX = 1 << 30
#: files and directories one bundle may hold
MAX_ENTRIES = 100_000
#: the first line of the manifest the tree digest is taken over
MANIFEST_HEADER = b"httk-flow-bundle/1\n"
#: directories never stored
SKIPPED_DIRS = frozenset({"__pycache__"})
_CHUNK = 1 << 20
_HINT = (
    "a bundle is the program and the small files it needs; give data with --input, or "
    "leave it on shared storage and pass its path as a parameter"
)


@dataclass(frozen=True, slots=True)
class Entry:
    """One member of a tree: a directory, or a regular file (its digest and mode)."""

    rel: str  # relative path, '/'-separated
    source: str  # the path it is read from (a link's target for a stored link)
    is_dir: bool
    executable: bool = False
    digest: str = ""
    size: int = 0


@dataclass(frozen=True, slots=True)
class Tree:
    """A scanned directory: its entries in manifest order and its tree digest."""

    root: str  # the real path of the directory
    entries: tuple[Entry, ...]
    digest: str
    size: int


def manifest(entries: tuple[Entry, ...]) -> bytes:
    """What the tree digest is the sha256 of: the header, then per entry in byte order of
    its path `d <path>\\0` or `f <x|-> <sha256> <path>\\0` (no path holds a NUL)."""
    out = [MANIFEST_HEADER]
    for e in entries:
        rel = os.fsencode(e.rel)
        if e.is_dir:
            out.append(b"d " + rel + b"\0")
        else:
            out.append(b"f " + (b"x " if e.executable else b"- ") + e.digest.encode())
            out.append(b" " + rel + b"\0")
    return b"".join(out)


def scan(directory: str, max_bytes: int = DEFAULT_BUNDLE_MAX) -> Tree:
    """Read a directory tree for a bundle (every file is hashed; nothing is written)."""
    obj = f"bundle {directory!r}"
    root = os.path.realpath(directory)
    if not os.path.isdir(root):
        what = "does not exist" if not os.path.lexists(directory) else "is not a directory"
        raise UsageError(what, obj=obj, hint="give the directory that holds the program")
    entries: list[Entry] = []
    total = 0
    for e in _walk(root, "", obj):
        entries.append(e)
        total += e.size
        if len(entries) > MAX_ENTRIES:
            raise UsageError(
                f"holds more than {MAX_ENTRIES} files and directories", obj=obj, hint=_HINT
            )
        if total > max_bytes:
            raise UsageError(
                f"holds more than the {human_size(max_bytes)} a bundle may (at least "
                f"{human_size(total)})",
                obj=obj,
                hint=f"{_HINT}; or raise the cap with --bundle-max SIZE",
            )
    entries.sort(key=lambda e: os.fsencode(e.rel))
    ordered = tuple(entries)
    return Tree(root, ordered, hashlib.sha256(manifest(ordered)).hexdigest(), total)


def _walk(root: str, rel: str, obj: str) -> Iterator[Entry]:
    here = os.path.join(root, rel) if rel else root
    try:
        with os.scandir(here) as it:
            items = sorted(it, key=lambda d: os.fsencode(d.name))
    except OSError as err:
        raise UsageError(
            f"holds {rel or '.'!r}, which cannot be read ({err.strerror})", obj=obj
        ) from None
    for d in items:
        sub = f"{rel}/{d.name}" if rel else d.name
        try:
            st = os.lstat(d.path)
        except OSError as err:
            raise UsageError(
                f"holds {sub!r}, which cannot be read ({err.strerror})", obj=obj
            ) from None
        source = d.path
        if stat.S_ISLNK(st.st_mode):
            source, st = _link_target(root, d.path, sub, obj)
        if stat.S_ISDIR(st.st_mode):
            if d.name in SKIPPED_DIRS:
                continue
            yield Entry(sub, source, True)
            yield from _walk(root, sub, obj)
        elif stat.S_ISREG(st.st_mode):
            executable = bool(st.st_mode & stat.S_IXUSR)
            yield Entry(sub, source, False, executable, _hash(source, st, sub, obj), st.st_size)
        else:
            raise UsageError(
                f"holds {sub!r}, which is not a regular file or a directory",
                obj=obj,
                hint="remove it from the directory (a bundle stores regular files only)",
            )


def _link_target(root: str, path: str, sub: str, obj: str) -> tuple[str, os.stat_result]:
    """A link inside the tree is stored as the regular file it names inside the tree."""
    target = os.path.realpath(path)
    shown = os.readlink(path)
    if not target.startswith(root + os.sep):
        raise UsageError(
            f"holds {sub!r}, a symbolic link to {shown!r} outside the bundle",
            obj=obj,
            hint="copy what it names into the directory, or give it with --input",
        )
    try:
        st = os.stat(target)
    except OSError:
        raise UsageError(
            f"holds {sub!r}, a symbolic link to nothing ({shown!r})", obj=obj
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(
            f"holds {sub!r}, a symbolic link to {shown!r}, which is not a regular file",
            obj=obj,
            hint="a bundle stores a link as the file it names; replace a link to a "
            "directory by the directory",
        )
    return target, st


def _hash(path: str, st: os.stat_result, sub: str, obj: str) -> str:
    h = hashlib.sha256()
    for chunk in _read(path, st, sub, obj):
        h.update(chunk)
    return h.hexdigest()


def _read(path: str, st: os.stat_result, sub: str, obj: str) -> Iterator[bytes]:
    """A regular file's bytes; O_NONBLOCK, so a file swapped for a FIFO cannot hang us."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise UsageError(f"holds {sub!r}, which cannot be read ({err.strerror})", obj=obj) from None
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(now.st_mode):
            raise UsageError(
                f"holds {sub!r}, which changed while it was read",
                obj=obj,
                hint="submit again once nothing writes to the directory",
            )
        while chunk := os.read(fd, _CHUNK):
            yield chunk
    finally:
        os.close(fd)


class BundleStore:
    """Stores trees under .flow/bundles/<digest>/: each once, published by one rename."""

    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        #: (real directory, max bytes) -> its tree, scanned once per submitting process
        self._trees: dict[tuple[str, int], Tree] = {}

    def resolve(self, directory: str, program: str, max_bytes: int = DEFAULT_BUNDLE_MAX) -> Program:
        """The program `program` (a path, which must lie inside `directory`) of the tree
        of `directory`, stored unless the same tree is stored already."""
        rel = program_in(directory, program)
        obj = f"program {program!r}"
        if not os.path.lexists(program):
            raise UsageError("does not exist", obj=obj, hint="check the path")
        top = os.path.realpath(directory)
        ws_root = os.path.realpath(self.ws.root)
        if ws_root == top or ws_root.startswith(top + os.sep):
            raise UsageError(
                f"holds the workspace {self.ws.root!r}",
                obj=f"bundle {directory!r}",
                hint="put the program and its files in a directory of their own",
            )
        key = (top, max_bytes)
        tree = self._trees.get(key) or scan(directory, max_bytes)
        entry = next((e for e in tree.entries if e.rel == rel), None)
        if entry is None or entry.is_dir:
            raise UsageError(
                "is not a regular file of the bundle",
                obj=obj,
                hint=f"give a file inside {directory!r}",
            )
        if not entry.executable:
            raise UsageError("is not executable", obj=obj, hint=f"run `chmod +x {program}`")
        with open(program, "rb") as fh:
            check_runnable(fh.read(LINE_MAX), program)
        if key not in self._trees:
            # stored only once the program is known to be one: a refusal leaves nothing
            self.store(tree, f"bundle {directory!r}")
            self._trees[key] = tree
        source = os.path.abspath(program)
        return Program(bundle=tree.digest, path=rel, name=os.path.basename(rel), source=source)

    def store(self, tree: Tree, obj: str) -> str:
        """Copy `tree` into the store (nothing when its digest is there); its directory."""
        dest = layout.bundle_dir(self.ws.root, tree.digest)
        if fs.exists(dest):
            return dest  # content-addressed: the same tree, stored before
        durable = self.ws.policy.durable
        tmp = os.path.join(self.ws.tmp, f"bundle-{tree.digest[:16]}.{os.urandom(4).hex()}")
        os.mkdir(tmp, 0o755)
        try:
            dirs = [tmp]
            for e in tree.entries:
                target = os.path.join(tmp, e.rel)
                if e.is_dir:
                    os.mkdir(target, 0o755)
                    dirs.append(target)
                else:
                    self._copy(e, target, durable, obj)
            if durable:
                for d in reversed(dirs):
                    fsync_dir(d)
            parent = layout.bundles_dir(self.ws.root)
            os.makedirs(parent, exist_ok=True)
            try:
                fs.rename(tmp, dest)
            except OSError:
                if not fs.exists(dest):
                    raise
                shutil.rmtree(tmp, ignore_errors=True)  # a concurrent identical store won
            if durable:
                fsync_dir(parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return dest

    @staticmethod
    def _copy(e: Entry, target: str, durable: bool, obj: str) -> None:
        """Copy one file, hashing it again: what is stored is what the digest names."""
        st = os.stat(e.source)
        h = hashlib.sha256()
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            for chunk in _read(e.source, st, e.rel, obj):
                h.update(chunk)
                os.write(fd, chunk)
            if h.hexdigest() != e.digest:
                raise UsageError(
                    f"holds {e.rel!r}, which changed while it was stored",
                    obj=obj,
                    hint="submit again once nothing writes to the directory",
                )
            if durable:
                os.fsync(fd)
            # read-only: a job cannot change the tree other jobs run
            os.fchmod(fd, 0o555 if e.executable else 0o444)
        finally:
            os.close(fd)


def program_in(directory: str, program: str) -> str:
    """The path of `program` relative to `directory`; a program outside it is refused."""
    root = os.path.realpath(directory)
    where = os.path.join(
        os.path.realpath(os.path.dirname(os.path.abspath(program))), os.path.basename(program)
    )
    rel = os.path.relpath(where, root)
    if rel == "." or rel.startswith(".." + os.sep) or rel == ".." or os.path.isabs(rel):
        hint = "give the program as a path inside the bundle directory"
        guess = os.path.join(directory, program)
        if not os.path.isabs(program) and os.path.isfile(guess):
            hint = f"did you mean {guess!r}? (PROGRAM is a path from here, not from DIR)"
        shown = f"{directory!r}" if root == directory else f"{directory!r} ({root})"
        raise UsageError(
            f"is not inside the bundle directory {shown}",
            obj=f"program {program!r}",
            hint=hint,
        )
    return rel.replace(os.sep, "/")
