"""Processes on this host: is this pid still the same process (not a reused pid)?"""

from __future__ import annotations


def proc_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: split after the last ')'
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def process_alive(pid: int, start_time: int | None) -> bool:
    """True while the same process (not a reused pid) exists on this host."""
    st = proc_start_time(pid)
    if st is None:
        return False
    return not start_time or st == start_time
