"""How one manager runs: workers, what it serves, its lease and its time limits."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from httk_flow.errors import UsageError
from httk_flow.protocol import layout
from httk_flow.protocol.durations import parse_duration
from httk_flow.protocol.names import check_label, check_placement
from httk_flow.protocol.workspace import check_lease

#: the batch script may export when its allocation ends (unix seconds)
ALLOCATION_END_ENV = layout.ENV_ALLOCATION_END


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

    @classmethod
    def resolve(
        cls,
        *,
        exit_when_idle: str | None,
        workers: int | None = None,
        pools: tuple[str, ...] = (),
        caps: tuple[str, ...] = (),
        lease: str | None = None,
        placements: tuple[str, ...] = (),
        walltime: str | None = None,
        log_format: str = "text",
        quiet: bool = False,
        drain_timeout: str = "60s",
        kill_grace: str = "10s",
        allocation_end: Callable[[], float | None] = lambda: None,
        environ: Mapping[str, str] = os.environ,
        now: float | None = None,
    ) -> ManagerConfig:
        """The configuration `flow serve` and `flow run` ask for, from their options as the
        user wrote them (durations as text); a bad one is a UsageError naming it.

        The work must end by the earliest of: `walltime` after `now`, what
        `allocation_end()` says (the batch system, of the allocation this runs in) and
        $FLOW_ALLOCATION_END in `environ`."""
        idle = (
            parse_duration(exit_when_idle, "--exit-when-idle")
            if exit_when_idle is not None
            else None
        )
        ends = []
        if walltime:
            start = time.time() if now is None else now
            ends.append(start + parse_duration(walltime, "--walltime"))
        alloc_end = allocation_end()
        if alloc_end is not None:
            ends.append(alloc_end)
        env_end = environ.get(ALLOCATION_END_ENV)
        if env_end:
            try:
                ends.append(float(env_end))
            except ValueError:
                raise UsageError("is not a unix time", obj=f"${ALLOCATION_END_ENV}") from None
        for p in pools:
            check_label(p, "pool")
        for c in caps:
            check_label(c, "capability")
        return cls(
            workers=workers or os.cpu_count() or 1,
            pools=tuple(pools),
            capabilities=tuple(caps),
            placements=tuple(check_placement(p) for p in placements),
            lease=check_lease(parse_duration(lease, "--lease")) if lease else None,
            exit_when_idle=idle,
            ends_at=min(ends) if ends else None,
            log_format="json" if log_format == "json" else "text",
            verbose=not quiet,
            drain_timeout=parse_duration(drain_timeout, "--drain-timeout"),
            kill_grace=parse_duration(kill_grace, "--kill-grace"),
        )
