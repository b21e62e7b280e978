"""How one manager runs: workers, what it serves, its lease and its time limits."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from httk_flow.errors import UsageError
from httk_flow.manager.inventory import Inventory, detect
from httk_flow.manager.slots import RESERVE_AFTER
from httk_flow.protocol import layout
from httk_flow.protocol.durations import parse_duration
from httk_flow.protocol.names import check_label, check_placement
from httk_flow.protocol.resources import NO_GRANT, Grant
from httk_flow.protocol.workspace import check_lease

#: the batch script may export when its allocation ends (unix seconds)
ALLOCATION_END_ENV = layout.ENV_ALLOCATION_END

#: the order of ready jobs of one priority: continuations first, or first come first served
Order = Literal["depth", "breadth"]


def _usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class ManagerConfig:
    workers: int = field(default_factory=lambda: _usable_cpus())
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
    #: the CPUs, GPUs, memory and site resources attempts share (None: `workers` CPUs
    #: and what the environment shows of the rest)
    inventory: Inventory | None = None
    #: pin each attempt's process group to its own CPUs
    bind_cpus: bool = False
    #: while every worker runs a short attempt, keep the next jobs launched behind their
    #: gates, to start when a worker frees (ahead.py)
    launch_ahead: bool = True
    #: seconds a job too large for what is free lets smaller ones past (claim.py)
    reserve_after: float = RESERVE_AFTER
    #: the batch job this manager runs in, as the batch system's backend names it
    #: (e.g. its job id); "" outside one
    batch_job: str = ""
    #: the line the batch system writes into that job's output when it signals it
    batch_notice: str = ""

    def __post_init__(self) -> None:
        # every way of building a manager meets the floor, not only the command line
        if self.lease is not None:
            check_lease(self.lease)

    def drain_note(self, signame: str) -> str | None:
        """What a manager logs when a signal starts its drain inside a batch job.

        The batch system writes its own line into the job's output as it signals (a
        cancel, to the eye); this one stands beside it and says what it was."""
        if not self.batch_job or signame != "SIGTERM":
            return None
        seen = f"a '{self.batch_notice}' line" if self.batch_notice else "a cancel line"
        return (
            f"drain: {signame} in {self.batch_job}, the batch system's drain (before the "
            f"walltime, or a cancel); {seen} beside this in the job's output is that "
            "signal, not a failure; running jobs are handed back (ready again, not charged "
            "a failure)"
        )

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
        launch_ahead: bool = True,
        cpus: int | None = None,
        gpus: str | None = None,
        mem: str | None = None,
        resources: tuple[str, ...] = (),
        bind: str | None = None,
        reserve_after: str | None = None,
        grant: Callable[[Mapping[str, str]], Grant] = lambda _env: NO_GRANT,
        allocation_end: Callable[[], float | None] = lambda: None,
        allocation: Callable[[], tuple[float, float] | None] | None = None,
        batch_job: Callable[[], tuple[str, str] | None] = lambda: None,
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
        after `now` and the allocation's end less the drain. `batch_job()` names the
        batch job this runs in and the line its batch system prints when it signals it
        (None outside one): the drain's log line says what that line was."""
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
        if bind not in (None, "none", "cpus"):
            raise UsageError("must be cpus or none", obj=f"--bind {bind!r}")
        inventory = detect(
            cpus=cpus,
            gpus=gpus,
            mem=mem,
            resources=resources,
            environ=environ,
            grant=grant(environ),
        )
        if workers is not None and cpus is None and workers > inventory.cpus:
            # --workers alone asked for this many at once, as before inventories: 1 CPU each
            inventory = dataclasses.replace(
                inventory,
                cpus=workers,
                sources=(("cpus", "--workers"), *inventory.sources[1:]),
            )
        return cls(
            workers=workers or inventory.cpus,
            inventory=inventory,
            bind_cpus=bind == "cpus",
            reserve_after=parse_duration(reserve_after, "--reserve-after")
            if reserve_after
            else RESERVE_AFTER,
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
            launch_ahead=launch_ahead,
            log_format="json" if log_format == "json" else "text",
            verbose=not quiet,
            drain_timeout=parse_duration(drain_timeout, "--drain-timeout"),
            kill_grace=parse_duration(kill_grace, "--kill-grace"),
            batch_job=job[0] if (job := batch_job()) else "",
            batch_notice=job[1] if job else "",
        )
