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

#: the order of ready jobs of one priority: continuations first, or first come first served
Order = Literal["depth", "breadth"]


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
    #: the usable end (unix time): a job is claimed only if its declared time ends by
    #: then. From --walltime, or the allocation's end less its drain and signal margin
    ends_at: float | None = None
    #: when the manager drains by itself (--walltime, or the allocation's end less its
    #: drain, should the batch system's signal not come); None: at `ends_at`
    drain_at: float | None = None
    #: the end of the allocation this manager runs in, as the batch system said (shown)
    allocation_end: float | None = None
    #: seconds the allocation keeps back before its end: the drain and the signal margin
    reserve: float | None = None
    #: ready jobs of one priority: "depth" claims jobs that advanced, retried or whose
    #: join released before new ones (its own commits first); "breadth" in arrival order
    order: Order = "depth"
    #: seconds between TERM and KILL of attempts when draining or cancelling
    kill_grace: float = 10.0
    #: seconds a drain waits for attempts to end before killing them
    drain_timeout: float = 60.0
    #: longest sleep between two ticks when nothing wakes the loop
    poll_interval: float = 0.5
    #: directory entries each discovery pass may visit per tick
    scan_budget: int = 2000
    log_format: Literal["text", "json"] = "text"
    #: print one line per transition and the manager's news; False (--quiet): only
    #: problems and the summary it ends with
    verbose: bool = True

    def __post_init__(self) -> None:
        # every way of building a manager meets the floor, not only the command line
        if self.lease is not None:
            check_lease(self.lease)

    @property
    def drains_at(self) -> float | None:
        """When the manager begins to drain by itself."""
        return self.drain_at if self.drain_at is not None else self.ends_at

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
        drain_before: str | None = None,
        signal_margin: str | None = None,
        order: str = "depth",
        allocation_end: Callable[[], float | None] = lambda: None,
        allocation: Callable[[], tuple[float, float] | None] | None = None,
        environ: Mapping[str, str] = os.environ,
        now: float | None = None,
    ) -> ManagerConfig:
        """The configuration `flow serve` and `flow run` ask for, from their options as the
        user wrote them (durations as text); a bad one is a UsageError naming it.

        The allocation ends at the earlier of what the batch system says (`allocation()`:
        the end of the allocation this runs in and the margin below, or None outside one;
        or `allocation_end()`, the end alone) and $FLOW_ALLOCATION_END in `environ`.
        The batch system signals the drain `drain_before` before that end, and may signal
        up to `signal_margin` earlier still (when not given: what the batch system that
        answered is known to do, else 0). So the usable end, by which claimed
        work must end, is the earliest of `walltime` after `now` and the allocation's end
        less drain and margin; the manager drains by itself at the earliest of `walltime`
        after `now` and the allocation's end less the drain."""
        idle = (
            parse_duration(exit_when_idle, "--exit-when-idle")
            if exit_when_idle is not None
            else None
        )
        drain = parse_duration(drain_before, "--drain-before") if drain_before else 0.0
        ends, drains = [], []
        if walltime:
            start = time.time() if now is None else now
            ends.append(start + parse_duration(walltime, "--walltime"))
            drains.append(ends[-1])
        allocs = []
        found = allocation() if allocation is not None else None
        alloc_end = found[0] if found is not None else allocation_end()
        margin = found[1] if found is not None else 0.0
        if signal_margin:
            margin = parse_duration(signal_margin, "--signal-margin")
        if alloc_end is not None:
            allocs.append(alloc_end)
        env_end = environ.get(ALLOCATION_END_ENV)
        if env_end:
            try:
                allocs.append(float(env_end))
            except ValueError:
                raise UsageError("is not a unix time", obj=f"${ALLOCATION_END_ENV}") from None
        if allocs:
            drains.append(min(allocs) - drain)
            ends.append(min(allocs) - drain - margin)
        if order not in ("depth", "breadth"):
            raise UsageError("must be depth or breadth", obj=f"--order {order!r}")
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
            drain_at=min(drains) if drains else None,
            allocation_end=min(allocs) if allocs else None,
            reserve=drain + margin if allocs else None,
            order="breadth" if order == "breadth" else "depth",
            log_format="json" if log_format == "json" else "text",
            verbose=not quiet,
            drain_timeout=parse_duration(drain_timeout, "--drain-timeout"),
            kill_grace=parse_duration(kill_grace, "--kill-grace"),
        )
