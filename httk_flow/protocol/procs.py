"""Processes on this host: is this pid still the same process (not a reused pid)?"""

from __future__ import annotations

import os
import time


def _stat_fields(pid: int) -> list[bytes] | None:
    # os.open/os.read: three system calls, where a buffered open() makes six
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    # the command name may hold spaces and parentheses: split after the last ')'
    return data[data.rfind(b")") + 2 :].split()


def proc_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if it does not exist."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


#: nanoseconds per clock tick of /proc/PID/stat's start time (USER_HZ)
_TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0
_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def boot_tick() -> int | None:
    """Now, in the clock ticks since boot that /proc/PID/stat counts a start time in (the
    kernel floors the boot-clock nanoseconds of the clone); None where there is no such
    clock."""
    if _BOOTTIME is None or not _TICK_NS:
        return None
    return time.clock_gettime_ns(_BOOTTIME) // _TICK_NS


#: whether /proc counts start times on the boot clock here: learned at the first spawn
#: (a kernel emulated in user space may count them otherwise), then trusted or not
_clock_agrees: bool | None = None


def spawned_start_time(pid: int, before: int | None) -> int | None:
    """The start time of a child just spawned, `before` being boot_tick() taken before the
    spawn: when no tick began during the spawn, the clone's tick is that one, and /proc
    is not read (an open and a read of a file the kernel writes out: 30 us a job)."""
    global _clock_agrees
    if before is None or _clock_agrees is False or boot_tick() != before:
        return proc_start_time(pid)
    if _clock_agrees is None:
        read = proc_start_time(pid)
        if read is not None:
            _clock_agrees = read == before
        return read
    return before


def _exited(fields: list[bytes]) -> bool:
    # a zombie (or dying) process has exited: only its parent has not collected it yet
    return not fields or fields[0] in (b"Z", b"X", b"x")


def process_alive(pid: int, start_time: int | None) -> bool:
    """True while the same process (not a reused pid) exists on this host."""
    fields = _stat_fields(pid)
    if fields is None or _exited(fields):
        return False
    try:
        st = int(fields[19])
    except (IndexError, ValueError):
        return False
    return not start_time or st == start_time


def this_process(pid: int, start_time: int | None) -> bool:
    """Whether (pid, start time) names the calling process itself.

    Several managers may share one process (tests, embedding): /proc cannot tell them apart,
    so their liveness must come from their heartbeats."""
    if pid != os.getpid():
        return False
    return not start_time or start_time == proc_start_time(pid)


def group_members_alive(pgid: int) -> bool:
    """Whether a process of the group that has not exited remains (zombies do not count)."""
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return True  # cannot tell: never claim it is gone
    for pid in pids:
        fields = _stat_fields(pid)
        if fields and len(fields) > 2 and fields[2] == str(pgid).encode() and not _exited(fields):
            return True
    return False


def group_alive(pgid: int) -> bool:
    """Whether a live (not exited) process remains in the process group on this host."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg also succeeds for exited members nobody has collected yet
    return group_members_alive(pgid)
