"""The program store: each submitted executable kept once, named by its sha256; where an
attempt finds its program (a stored copy, a file of a bundle, or the file itself, run in
place once its digest is checked)."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import time
from collections.abc import Callable

from httk_flow.errors import UsageError
from httk_flow.protocol import layout
from httk_flow.protocol.bundles import DEFAULT_BUNDLE_MAX, BundleStore
from httk_flow.protocol.fsio import fs, fsync_dir
from httk_flow.protocol.jobspec import Program
from httk_flow.protocol.shebang import check_runnable
from httk_flow.protocol.workspace import Workspace

MAX_PROGRAM = 256 * 1024 * 1024


class ProgramStore:
    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self.bundles = BundleStore(ws)
        self._by_path: dict[tuple[str, str | None, int, bool], Program] = {}

    def resolve(
        self,
        program: str,
        *,
        bundle: str | None = None,
        bundle_max: int = DEFAULT_BUNDLE_MAX,
        in_place: bool = False,
    ) -> Program:
        """An executable file is stored by digest (with `bundle`, the tree it lies in; with
        `in_place`, only its digest is kept); anything else must be a command on PATH."""
        if bundle is not None and in_place:
            raise UsageError(
                "cannot be combined with --in-place",
                obj=f"--bundle {bundle!r}",
                hint="a bundle runs a stored copy of the directory; --in-place runs the file "
                "where it is",
            )
        memo = (program, bundle, bundle_max, in_place)
        cached = self._by_path.get(memo)
        if cached is not None:
            return cached
        if bundle is not None:
            result = self.bundles.resolve(bundle, program, bundle_max)
        elif in_place:
            result = self._in_place(program)
        elif "/" in program or os.path.isfile(program):
            result = self._store(program)
        else:
            if not program or "\0" in program or shutil.which(program) is None:
                raise UsageError(
                    "is neither an executable file nor a command on PATH",
                    obj=f"program {program!r}",
                    hint="give a path to an executable script, e.g. ./run.sh",
                )
            result = Program(command=program, name=program)
        self._by_path[memo] = result
        return result

    def _read(self, path: str) -> bytes:
        """The bytes of an executable regular file the user named, within MAX_PROGRAM."""
        obj = f"program {path!r}"
        try:
            st = os.stat(path)
        except OSError as e:
            raise UsageError(f"cannot be read ({e.strerror})", obj=obj) from e
        if not stat.S_ISREG(st.st_mode):
            raise UsageError("is not a regular file", obj=obj)
        if not os.access(path, os.X_OK):
            raise UsageError("is not executable", obj=obj, hint=f"run `chmod +x {path}`")
        if st.st_size > MAX_PROGRAM:
            raise UsageError("is larger than 256 MiB; keep data out of the program", obj=obj)
        with open(path, "rb") as fh:
            data = fh.read()
        check_runnable(data, path)
        return data

    def _in_place(self, path: str) -> Program:
        """Run where it is: its digest is kept, and checked before every launch."""
        if "/" not in path and not os.path.isfile(path):
            raise UsageError(
                "is not a file; --in-place runs a file where it is",
                obj=f"program {path!r}",
                hint="give its path (e.g. ./run.sh); a command on PATH runs without --in-place",
            )
        digest = hashlib.sha256(self._read(path)).hexdigest()
        full = os.path.abspath(path)
        return Program(digest=digest, path=full, name=os.path.basename(full), in_place=True)

    def _store(self, path: str) -> Program:
        data = self._read(path)
        digest = hashlib.sha256(data).hexdigest()
        dest = self.ws.program_path(digest)
        if not fs.exists(dest):
            tmp = os.path.join(self.ws.tmp, f"prog-{digest}-{os.getpid()}")
            with open(tmp, "wb") as fh:
                fh.write(data)
                if self.ws.policy.durable:
                    os.fsync(fh.fileno())
            os.chmod(tmp, 0o755)
            fs.rename(tmp, dest)  # content-addressed: a concurrent identical store is harmless
            if self.ws.policy.durable:
                fsync_dir(self.ws.programs)
        source = os.path.abspath(path)
        return Program(digest=digest, name=os.path.basename(path), source=source)


def missing(ws: Workspace, program: Program, present: set[str] | None = None) -> str | None:
    """Why a job's program cannot be in the workspace's stores (None: it is there).

    `present`: paths already seen to exist, added to (a pass registering many jobs of one
    program looks once: store entries are never removed while a job names them)."""
    if program.stored and not _exists(ws.program_path(program.stored), present):
        return "names a program that is not in the program store"
    if program.bundle and not _exists(layout.bundle_dir(ws.root, program.bundle), present):
        return f"names a bundle that is not in the bundle store ({program.bundle})"
    return None


def _exists(path: str, present: set[str] | None) -> bool:
    if present is not None and path in present:
        return True
    if not fs.exists(path):
        return False
    if present is not None:
        present.add(path)
    return True


def executable(ws: Workspace, program: Program) -> str:
    """The path (or the command name) an attempt executes."""
    if program.bundle:
        return os.path.join(layout.bundle_dir(ws.root, program.bundle), program.path or "")
    if program.in_place:
        return program.path or ""
    if program.digest:
        return ws.program_path(program.digest)
    return program.command or "false"


def program_env(ws: Workspace, program: Program) -> dict[str, str]:
    """What an attempt is told about where its program came from (docs/bash-api.md)."""
    env: dict[str, str] = {}
    source = program.path if program.in_place else program.source
    if source:
        env[layout.ENV_PROGRAM_SOURCE] = source
    if program.bundle:
        env[layout.ENV_BUNDLE_DIR] = layout.bundle_dir(ws.root, program.bundle)
    return env


#: a file whose stamps are this recent is hashed again at its next check: an edit in the
#: same timestamp tick, of the same size, would leave its stat unchanged
_RACY = 2.0
_CACHE_MAX = 4096


class InPlaceCheck:
    """Before each launch of an in-place program: does the file still have its digest?

    The digest of a file is kept by (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns):
    an unchanged file is not read again. Any write moves the ctime, so a changed file
    is read again (docs/protocol.md §9 says what this cannot see)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._seen: dict[str, tuple[tuple[int, ...], str]] = {}

    def changed(self, program: Program) -> str | None:
        """Why the program must not run (the failure's message); None: it may."""
        path, want = program.path or "", program.digest or ""
        try:
            got = self._digest(path)
        except FileNotFoundError:
            return (
                f"the in-place program {path} is gone (it was submitted with sha256 {want}); "
                "resubmit it, or submit without --in-place to run a stored copy"
            )
        except OSError as e:
            return (
                f"the in-place program {path} cannot be checked ({e.strerror}); it was "
                f"submitted with sha256 {want}; it was not run"
            )
        if got == want:
            return None
        return (
            f"the in-place program {path} changed since it was submitted (sha256 {want}, "
            f"now {got}); the changed code was not run: resubmit to run it, or submit "
            "without --in-place to run a stored copy"
        )

    def _digest(self, path: str) -> str:
        st = os.stat(path)
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        hit = self._seen.get(path)
        if hit is not None and hit[0] == key:
            return hit[1]
        h = hashlib.sha256()
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            before = os.fstat(fd)
            if not stat.S_ISREG(before.st_mode):
                raise OSError(errno.EINVAL, "not a regular file", path)
            while chunk := os.read(fd, 1 << 20):
                h.update(chunk)
            after = os.fstat(fd)
        finally:
            os.close(fd)
        digest = h.hexdigest()
        stamp = (after.st_dev, after.st_ino, after.st_size, after.st_mtime_ns, after.st_ctime_ns)
        recent = max(after.st_mtime, after.st_ctime) > self.clock() - _RACY
        if stamp == key and not recent:
            if len(self._seen) >= _CACHE_MAX:
                self._seen.clear()
            self._seen[path] = (key, digest)
        return digest
