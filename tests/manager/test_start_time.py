"""The start time a manager records for an attempt it spawns (the pid's identity for
takeovers, protocol.md §8) is /proc's own, whether read from the boot clock or from /proc."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from httk_flow.protocol import procs
from httk_flow.protocol.procs import boot_tick, proc_start_time, spawned_start_time


@contextmanager
def _spawned() -> Iterator[tuple[int, int | None]]:
    """A child spawned as a manager spawns one, alive throughout: (pid, boot_tick()
    before its spawn)."""
    before = boot_tick()
    pid = os.posix_spawn("/bin/sleep", ["sleep", "30"], dict(os.environ))
    try:
        yield pid, before
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_the_boot_clock_gives_the_start_time_proc_reports_for_every_spawn() -> None:
    from_clock = 0
    for _ in range(200):
        with _spawned() as (pid, before):
            got = spawned_start_time(pid, before)
            assert got == proc_start_time(pid)
            from_clock += boot_tick() == before == got
    # the clock, not /proc, answered most of them (a spawn takes far less than a tick)
    assert from_clock > 50


def test_once_the_clock_agreed_proc_is_read_only_for_a_spawn_that_spanned_a_tick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(procs, "_clock_agrees", True)
    reads: list[int] = []

    def counted(pid: int) -> int | None:
        reads.append(pid)
        return proc_start_time(pid)

    monkeypatch.setattr(procs, "proc_start_time", counted)
    spanned = 0
    for _ in range(50):
        with _spawned() as (pid, before):
            got = spawned_start_time(pid, before)
            spanned += boot_tick() != before  # at least as many as spanned the spawn
            assert got == proc_start_time(pid)
    assert len(reads) <= spanned < 25


def test_a_tick_begun_during_the_spawn_reads_proc() -> None:
    with _spawned() as (pid, before):
        assert before is not None
        # as if the clock had moved on during the spawn: the tick before is not the clone's
        assert spawned_start_time(pid, before - 1) == proc_start_time(pid)
        assert spawned_start_time(pid, None) == proc_start_time(pid)


def test_a_kernel_whose_proc_counts_otherwise_is_read_for_every_spawn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first spawn compares the clock with /proc: where they differ (a kernel emulated
    in user space may count start times otherwise), /proc is read from then on."""
    monkeypatch.setattr(procs, "_clock_agrees", None)
    reads: list[int] = []

    def elsewhere(pid: int) -> int | None:
        reads.append(pid)
        real = proc_start_time(pid)
        return None if real is None else real + 7

    monkeypatch.setattr(procs, "proc_start_time", elsewhere)
    for _ in range(3):
        with _spawned() as (pid, before):
            assert spawned_start_time(pid, before) == elsewhere(pid)
    assert procs._clock_agrees is False
    assert len(reads) == 6  # each spawn's, and the test's own
