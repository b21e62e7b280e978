"""The program store: each submitted executable kept once, named by its sha256."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat

from httk_flow.errors import UsageError
from httk_flow.protocol.fsio import fs, fsync_dir
from httk_flow.protocol.jobspec import Program
from httk_flow.protocol.workspace import Workspace

MAX_PROGRAM = 256 * 1024 * 1024


class ProgramStore:
    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self._by_path: dict[str, Program] = {}

    def resolve(self, program: str) -> Program:
        """An executable file is stored by digest; anything else must be a command on PATH."""
        cached = self._by_path.get(program)
        if cached is not None:
            return cached
        if "/" in program or os.path.isfile(program):
            result = self._store(program)
        else:
            if not program or "\0" in program or shutil.which(program) is None:
                raise UsageError(
                    "is neither an executable file nor a command on PATH",
                    obj=f"program {program!r}",
                    hint="give a path to an executable script, e.g. ./run.sh",
                )
            result = Program(command=program, name=program)
        self._by_path[program] = result
        return result

    def _store(self, path: str) -> Program:
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
        return Program(digest=digest, name=os.path.basename(path))
