"""The start time a manager records for an attempt it spawns (the pid's identity for
takeovers, protocol.md §8) is /proc's own, whether read from the boot clock or from /proc."""

from __future__ import annotations

import os
import signal

from httk_flow.protocol.procs import boot_tick, proc_start_time, spawned_start_time


def _spawn_sleeper() -> int:
    return os.posix_spawn("/bin/sleep", ["sleep", "30"], dict(os.environ))


def _end(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def test_the_boot_clock_gives_the_start_time_proc_reports_for_every_spawn() -> None:
    from_clock = 0
    for _ in range(200):
        before = boot_tick()
        pid = _spawn_sleeper()
        try:
            got = spawned_start_time(pid, before)
            assert got == proc_start_time(pid)
            from_clock += boot_tick() == before == got
        finally:
            _end(pid)
    # the clock, not /proc, answered most of them (a spawn takes far less than a tick)
    assert from_clock > 100


def test_a_tick_begun_during_the_spawn_reads_proc() -> None:
    before = boot_tick()
    assert before is not None
    pid = _spawn_sleeper()
    try:
        # as if the clock had moved on during the spawn: the tick before is not the clone's
        assert spawned_start_time(pid, before - 1) == proc_start_time(pid)
        assert spawned_start_time(pid, None) == proc_start_time(pid)
    finally:
        _end(pid)
