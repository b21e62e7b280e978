"""How one manager runs: workers, what it serves, its lease and its time limits."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from httk_flow.protocol.workspace import check_lease


@dataclass(frozen=True)
class ManagerConfig:
    workers: int = os.cpu_count() or 1
    pools: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    placements: tuple[str, ...] = ()
    #: None: the workspace policy's lease
    lease: float | None = None
    #: None: serve until stopped; a number: exit after idling this many seconds
    exit_when_idle: float | None = None
    #: unix time by which all work must end (from --walltime or the allocation)
    ends_at: float | None = None
    #: seconds between TERM and KILL of attempts when draining or cancelling
    kill_grace: float = 10.0
    #: seconds a drain waits for attempts to end before killing them
    drain_timeout: float = 60.0
    #: longest sleep between two ticks when nothing wakes the loop
    poll_interval: float = 0.5
    #: directory entries each discovery pass may visit per tick
    scan_budget: int = 2000
    log_format: Literal["text", "json"] = "text"
    #: print one line per transition
    verbose: bool = True

    def __post_init__(self) -> None:
        # every way of building a manager meets the floor, not only the command line
        if self.lease is not None:
            check_lease(self.lease)
