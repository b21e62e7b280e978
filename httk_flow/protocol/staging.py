"""Names of the payloads a submitter assembles in .flow/tmp (docs/protocol.md §6).

A staging directory is `job-<id>.<nonce>.<pid>-<start>@<host>`: its maker's pid, /proc
start time and host, so whoever finds it later can tell, on that host, whether its maker
still lives (a reused pid has another start time). One from another host, or of the
older form `job-<id>.<nonce>`, is judged by its age alone.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
from dataclasses import dataclass

from httk_flow.protocol.procs import proc_start_time, process_alive

#: a staging directory (or other temporary) younger than this may belong to a live
#: submitter on another host: only past it is it anybody's to remove
STAGING_GRACE = 3600.0
#: host names are cut to this (a file name has 255 bytes; HOST_NAME_MAX is 64)
_HOST_MAX = 64
_NAME = re.compile(r"job-([0-9a-f]{32})\.([0-9a-f]{8})(?:\.(\d+)-(\d+)@([A-Za-z0-9._-]+))?")


def _host_word(host: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", host)[:_HOST_MAX] or "_"


_OWN: tuple[int, str] | None = None


def _own() -> tuple[int, str]:
    """This process's pid-start and host words (after a fork, the child's own)."""
    global _OWN
    pid = os.getpid()
    if _OWN is None or _OWN[0] != pid:
        _OWN = (pid, f"{pid}-{proc_start_time(pid) or 0}@{_host_word(socket.gethostname())}")
    return _OWN


def staging_name(job_id: str) -> str:
    """A fresh staging directory name for job `job_id`, owned by this process."""
    return f"job-{job_id}.{os.urandom(4).hex()}.{_own()[1]}"


@dataclass(frozen=True, slots=True)
class Staging:
    """A staging directory's name, parsed: whose job, and who made it (when it says)."""

    job_id: str
    pid: int | None
    start_time: int | None
    host: str | None


def parse_staging(name: str) -> Staging | None:
    """The parts of a staging directory name; None: not one (another temporary)."""
    m = _NAME.fullmatch(name)
    if m is None:
        return None
    if m.group(3) is None:
        return Staging(m.group(1), None, None, None)
    return Staging(m.group(1), int(m.group(3)), int(m.group(4)), m.group(5))


def maker_gone(st: Staging) -> bool:
    """Whether the submitter that made it is provably gone: it was made on this host and
    that process (pid and start time) no longer runs. Unknown makers are never gone."""
    if st.pid is None or st.host != _host_word(socket.gethostname()):
        return False
    return not process_alive(st.pid, st.start_time or None)


def removable(name: str, age: float) -> bool:
    """Whether a staging directory `name` of `age` seconds can belong to no live
    submitter: its maker is gone, or it is older than STAGING_GRACE."""
    st = parse_staging(name)
    return age >= STAGING_GRACE or (st is not None and maker_gone(st))


def sweep(tmp_dir: str, now: float) -> list[str]:
    """Remove the staging directories in `tmp_dir` that no live submitter can own (see
    `removable`); the paths removed. Other temporaries are left to `flow fsck`."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(tmp_dir))
    except OSError:
        return removed
    for e in entries:
        if parse_staging(e.name) is None or not e.is_dir(follow_symlinks=False):
            continue
        try:
            age = now - e.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue  # gone meanwhile: its submitter finished it
        if removable(e.name, age):
            shutil.rmtree(e.path, ignore_errors=True)
            removed.append(e.path)
    return removed
