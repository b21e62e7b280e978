"""Which programs the launcher starts as `bash PROGRAM`: those whose #! line names bash.

For such a program the kernel would start /bin/sh (the launcher), then env(1) searching
PATH, then bash: three execs where one will do. bash itself sources the gate
(shell/flow-gate.sh, as BASH_ENV) before it reads the program, so the gate holds exactly as
with the /bin/sh launcher (protocol.md §9). Everything else runs behind /bin/sh.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat

from httk_flow.protocol.shebang import LINE_MAX, interpreter_line, words

__all__ = ["bash_for", "can_gate_bash", "gates_in"]

#: the #! interpreters taken as bash: the path of a bash, or env(1) naming bash alone
_ENV = "/usr/bin/env"


@functools.cache
def can_gate_bash() -> bool:
    """bash ignores BASH_ENV when its real and effective ids differ: never gate that way then
    (a setuid manager is odd, but the gate must never be skipped), nor when the manager's
    own environment names a BASH_ENV of its own (the program expects that one)."""
    return (
        os.getuid() == os.geteuid()
        and os.getgid() == os.getegid()
        and "BASH_ENV" not in os.environ
        # the gate is handed over as /dev/fd/N (launcher.py): never as a path that an
        # upgrade in place could remove or half-write, which bash would skip with a warning
        and os.path.isdir("/dev/fd")
    )


#: variables under which bash skips BASH_ENV (posix mode: POSIXLY_CORRECT, SHELLOPTS
#: naming posix) or starts otherwise than the gate expects (BASHOPTS, ENV in posix mode)
_SKIPS_GATE = ("BASH_ENV", "POSIXLY_CORRECT", "POSIX_PEDANTIC", "SHELLOPTS", "BASHOPTS")
#: what the gate runs by name: an exported function of one of these names would run in its
#: place (a `read` that returns at once would open the gate early)
_GATE_NAMES = tuple("read cd exec printf echo exit return unset builtin command".split())
#: exported functions as bash names them: name%% (upstream), name() (older distributions)
_GATE_FUNCS = tuple(f"BASH_FUNC_{n}{tail}" for n in _GATE_NAMES for tail in ("%%", "()"))


def gates_in(env: dict[str, str]) -> bool:
    """Whether bash started with `env` runs the gate as written: no variable that makes it
    skip BASH_ENV, no exported function that shadows a command the gate uses. Otherwise
    the attempt goes through the /bin/sh launcher, which no environment can bypass."""
    if any(k in env for k in _SKIPS_GATE):
        return False
    return not any(k in env for k in _GATE_FUNCS)


def bash_for(program: str, path: str) -> str | None:
    """The bash to run an absolute `program` with (its #! line names bash and no option),
    else None. Cached by path: stored programs and bundles are immutable by their digest,
    and one run in place is checked against its digest before every launch; the gate looks
    again that the file is there and executable."""
    if not program.startswith("/") or not can_gate_bash():
        return None
    interp = _shebang(program)
    if interp is None:
        return None
    if interp == _ENV:
        return _which_bash(path)
    return interp


@functools.lru_cache(maxsize=4096)
def _shebang(program: str) -> str | None:
    """The interpreter of `program`'s #! line when it is bash (a path or env bash), or None."""
    try:
        fd = os.open(program, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o111:
            return None
        head = os.read(fd, LINE_MAX)
    except OSError:
        return None
    finally:
        os.close(fd)
    line = interpreter_line(head) if b"\n" in head else None
    if line is None:
        return None
    # as the kernel reads it: the interpreter, then one argument (a CR of a DOS file is
    # part of the name, and the kernel fails to find "bash\r": so must we)
    named = words(line)
    if named == [_ENV, "bash"]:
        return _ENV
    if len(named) == 1 and named[0].startswith("/") and named[0].endswith("/bash"):
        return named[0] if _plain_executable(named[0]) else None
    return None


@functools.lru_cache(maxsize=64)
def _which_bash(path: str) -> str | None:
    """bash on PATH as env(1) would find it (the attempt's PATH is the manager's)."""
    found = shutil.which("bash", path=path)
    return os.path.abspath(found) if found and _plain_executable(found) else None


def _plain_executable(path: str) -> bool:
    """An executable file that is not setuid or setgid: bash run with ids that differ
    reads no BASH_ENV, so such a bash would skip the gate."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (
        stat.S_ISREG(st.st_mode)
        and not st.st_mode & (stat.S_ISUID | stat.S_ISGID)
        and os.access(path, os.X_OK)
    )
