"""What queued work needs and what live managers can fit: the declared times of queued jobs
(read from a bounded sample), the usable time each live manager has left, and the walltime
an allocation needs so that a request fits before its drain.

A marker's name carries a job's service class (pool and capabilities) but not its time,
which only its job.json holds, and reading every job.json would make every look cost a file
per job. So one look reads at most a bounded reservoir sample of the jobs it has not read
before (uniform over the stream, per service class), and estimates the rest from it. A
job.json never changes: what was read is kept (bounded), so a holder that looks again
(`flow status --watch`, `flow wait`, the reconciler) comes to know every job.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from httk_flow.errors import FlowError
from httk_flow.protocol.durations import compact_duration
from httk_flow.protocol.handles import JobHandle
from httk_flow.protocol.jobs import load_spec
from httk_flow.protocol.leases import Liveness, ManagerInfo
from httk_flow.protocol.resources import format_size
from httk_flow.protocol.services import ServiceClass
from httk_flow.protocol.workspace import Workspace

#: job.json read at most per look and service class, and per look in all
SAMPLE_PER_CLASS = 200
SAMPLE_TOTAL = 1000
#: time requests kept between looks (job key -> seconds or None)
KEEP = 200_000
#: seconds an allocation's manager may take to start and learn its end
START_SLACK = 30.0
#: what an allocation keeps back when nothing better is known: a 2m drain, a 1m margin
DEFAULT_RESERVE = 180.0


def allocation_walltime(need: float, reserve: float) -> float:
    """The walltime, in whole minutes, of an allocation in which a job of `need` seconds
    fits before the drain: the need, what the allocation keeps back (drain and signal
    margin) and the time its manager takes to start."""
    return 60.0 * math.ceil((need + reserve + START_SLACK) / 60.0 - 1e-9)


@dataclass
class QueueTimes:
    """The declared times of the queued jobs of one service class, as far as read."""

    #: jobs of the class seen
    n: int = 0
    #: declared time (None: none declared) -> jobs read with it
    read: Counter[float | None] = field(default_factory=Counter)

    @property
    def sampled(self) -> int:
        return sum(self.read.values())

    @property
    def exact(self) -> bool:
        return self.sampled == self.n

    def count(self, which: Callable[[float | None], bool]) -> int:
        """Jobs whose time satisfies `which`: exact when all were read, else estimated
        from those read (never 0 when one read does)."""
        hit = sum(c for t, c in self.read.items() if which(t))
        if not hit or self.exact:
            return hit
        return max(1, round(hit * self.n / self.sampled))

    def merged(self, other: QueueTimes) -> QueueTimes:
        return QueueTimes(self.n + other.n, self.read + other.read)


_MISSING = object()
_REMAINING = "the longest remaining manager time is"
_REMAINING_RE = re.compile(re.escape(_REMAINING) + r" \S+;")


def steady(reason: str) -> str:
    """A reason without the numbers that change as time passes (the remaining time), to
    tell a new reason from the same one said again."""
    return _REMAINING_RE.sub(_REMAINING + " ...;", reason)


class TimeRequests:
    """Declared times of queued jobs by key, read from job.json at most a bounded sample at a
    time and kept between looks (bounded)."""

    def __init__(
        self,
        ws: Workspace,
        *,
        per_class: int = SAMPLE_PER_CLASS,
        total: int = SAMPLE_TOTAL,
        keep: int = KEEP,
    ) -> None:
        self.ws = ws
        self.per_class = per_class
        self.total = total
        self.keep = keep
        self.known: OrderedDict[str, float | None] = OrderedDict()
        self._rng = random.Random(0x71E)

    def look(self) -> Look:
        return Look(self)

    def remember(self, key: str, t: float | None) -> None:
        self.known[key] = t
        if len(self.known) > self.keep:
            self.known.popitem(last=False)


class Look:
    """One pass over a stream of queued markers: `see` each, then `finish`."""

    def __init__(self, req: TimeRequests) -> None:
        self.req = req
        self.by: dict[str, QueueTimes] = {}
        self._sample: dict[str, list[JobHandle]] = {}
        self._unread: Counter[str] = Counter()

    def see(self, h: JobHandle) -> None:
        cid = h.marker.service
        q = self.by.get(cid)
        if q is None:
            q = self.by[cid] = QueueTimes()
        q.n += 1
        t = self.req.known.get(h.key, _MISSING)
        if t is not _MISSING:
            q.read[t] += 1  # type: ignore[index]
            return
        # a reservoir: every unread job of the class is as likely to be read
        self._unread[cid] += 1
        sample = self._sample.setdefault(cid, [])
        if len(sample) < self.req.per_class:
            sample.append(h)
        else:
            j = self.req._rng.randrange(self._unread[cid])
            if j < self.req.per_class:
                sample[j] = h

    def finish(self, only: set[str] | None = None) -> dict[str, QueueTimes]:
        """Read the sample (at most the total bound; of the classes `only` names, if
        given) and return each class's times."""
        budget = self.req.total
        classes = sorted(
            (c for c in self._sample if only is None or c in only),
            key=lambda c: len(self._sample[c]),
        )
        for i, cid in enumerate(classes):
            share = budget // (len(classes) - i)
            for h in self._sample[cid][:share]:
                budget -= 1
                try:
                    t = load_spec(self.req.ws, h.placement, h.key).time
                except (FlowError, OSError):
                    continue  # gone meanwhile, or damaged (a manager reports that)
                self.req.remember(h.key, t)
                self.by[cid].read[t] += 1
        return self.by


@dataclass(frozen=True)
class Capacity:
    """What the live managers serving one class can still take on."""

    #: the longest usable time one of them has left; None: one has no end
    longest: float | None
    #: the manager with that time
    best: ManagerInfo


def capacity(live: list[Liveness], sc: ServiceClass, now: float) -> Capacity | None:
    """The capacity of the live managers that serve `sc` (None when none does)."""
    best: tuple[float, ManagerInfo] | None = None
    for m in live:
        if not sc.served_by(m.info.pools, m.info.capabilities):
            continue
        left = m.info.usable_left(now)
        if left is None:
            return Capacity(None, m.info)
        if best is None or left > best[0]:
            best = (left, m.info)
    return Capacity(best[0], best[1]) if best is not None else None


def too_big(live: list[Liveness], sc: ServiceClass) -> str | None:
    """Why no live manager serving `sc` could ever hold its request, with the numbers and
    the command that would (None: one can, none serves it at all, or one is too old to
    say what it has)."""
    if sc.need.is_default:
        return None
    serving = [m.info for m in live if sc.served_by(m.info.pools, m.info.capabilities)]
    offers = [i.inventory for i in serving if i.inventory is not None]
    if not serving or len(offers) < len(serving):
        return None
    if any(o.lacks(sc.need) is None for o in offers):
        return None
    largest = max(offers, key=lambda o: (o.cpus, len(o.gpus), o.mem))
    who = "the largest live manager serving it" if len(offers) > 1 else "the live manager"
    why = largest.lacks(sc.need, who=who)
    need = sc.need
    flags = [f"--cpus {need.cpus}"] * (need.cpus > max(o.cpus for o in offers))
    flags += [f"--gpus {need.gpus}"] * (need.gpus > max(len(o.gpus) for o in offers))
    flags += [f"--mem {format_size(need.mem)}"] * (need.mem > max(o.mem for o in offers))
    flags += [f"--resource {k}={v}" for k, v in need.custom]
    flags += [f"--pool {sc.pool}"] * bool(sc.pool) + [f"--capability {c}" for c in sc.requires]
    return f"{why}; start one with `flow serve {' '.join(flags)}`"


@dataclass(frozen=True)
class Unfit:
    """Ready jobs of one class that no live manager serving it can fit."""

    count: int
    shortest: float
    longest: float
    capacity: Capacity
    #: the jobs read to know it, and how many there are (equal when exact)
    sampled: int
    of: int

    @property
    def walltime(self) -> float | None:
        """The walltime of an allocation the longest fits in (when managers run in them)."""
        reserve = self.capacity.best.reserve
        return allocation_walltime(self.longest, reserve) if reserve is not None else None

    def reason(self) -> str:
        need = compact_duration(self.longest)
        if self.shortest == self.longest:
            text = f"needs {need}"
        else:
            text = f"need {compact_duration(self.shortest)} to {need}"
        left = compact_duration(self.capacity.longest or 0.0)
        text += f"; {_REMAINING} {left}; "
        wall = self.walltime
        if wall is not None:
            text += f"submit allocations of at least {compact_duration(wall)}"
        else:
            text += (
                f"start managers with at least {need} to go (a longer --walltime, or "
                f"allocations of at least "
                f"{compact_duration(allocation_walltime(self.longest, DEFAULT_RESERVE))})"
            )
        if self.sampled < self.of:
            text += f" (estimated from {self.sampled} of {self.of} jobs read)"
        return text

    def details(self) -> dict[str, object]:
        return {
            "needs": self.longest,
            "longest_remaining": round(self.capacity.longest or 0.0, 1),
            "walltime": self.walltime,
            "estimated": self.sampled < self.of,
        }


def unfit(q: QueueTimes, cap: Capacity) -> Unfit | None:
    """The jobs of `q` whose declared time exceeds what `cap` can still take."""
    if cap.longest is None:
        return None
    longest = cap.longest
    needs = [t for t in q.read if t is not None and t > longest]
    if not needs:
        return None
    n = q.count(lambda t: t is not None and t > longest)
    return Unfit(n, min(needs), max(needs), cap, q.sampled, q.n)
