"""Blocking until jobs are terminal: the one place that polls on a user's behalf."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from httk_flow.protocol.discovery import walk_all
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle, locate_key
from httk_flow.protocol.workspace import Workspace


@dataclass(frozen=True)
class WaitResult:
    total: int
    done: int
    succeeded: int
    failed: int
    cancelled: int
    timed_out: bool

    @property
    def exit_code(self) -> int:
        """CLI.md: 0 all succeeded, 1 some failed or cancelled, 3 timed out."""
        if self.timed_out:
            return 3
        return 0 if self.succeeded == self.total else 1


def _snapshot(
    ws: Workspace, jobs: list[JobHandle] | None
) -> tuple[list[JobHandle], dict[State, int]]:
    counts = dict.fromkeys(State, 0)
    if jobs is None:
        for st in State:
            for _ in walk_all(ws, st):
                counts[st] += 1
        return [], counts
    now: list[JobHandle] = []
    for h in jobs:
        cur = h if h.state.is_permanent else (locate_key(ws, h.placement, h.key) or h)
        now.append(cur)
        counts[cur.state] += 1
    return now, counts


def wait_jobs(
    ws: Workspace,
    jobs: list[JobHandle] | None,
    *,
    timeout: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    interval: float = 0.5,
) -> WaitResult:
    """Until every named job (all jobs if None) is terminal, or the timeout passes."""
    start = time.monotonic()
    current = jobs
    while True:
        current_list, counts = _snapshot(ws, current)
        if current is not None:
            current = current_list
        total = sum(counts.values())
        done = counts[State.SUCCEEDED] + counts[State.FAILED] + counts[State.CANCELLED]
        if progress:
            progress(done, total)
        timed_out = timeout is not None and time.monotonic() - start >= timeout
        if done == total or timed_out:
            return WaitResult(
                total,
                done,
                counts[State.SUCCEEDED],
                counts[State.FAILED],
                counts[State.CANCELLED],
                timed_out and done != total,
            )
        time.sleep(interval)
