"""Allocations shaped to the work: queued jobs grouped by service class (pool,
capabilities and resource request, all in the marker's name), and for each group the
allocation shape that fits it within the per-node limits the user gave or the backend
knows. A job too large for any node those limits allow is said, with the numbers, and
not paid for."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from httk_flow.protocol.discovery import walk_all
from httk_flow.protocol.resources import Request, format_size, parse_resource
from httk_flow.protocol.services import DEFAULT_POOL, ServiceClass
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace
from httk_flow.scale.allocation_records import AllocationRecord, AllocPhase
from httk_flow.scale.backends.base import AllocationProfile, NodeLimits


@dataclass(frozen=True)
class Offer:
    """What every manager the reconciler starts serves, as its serve arguments say."""

    pools: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    #: site resources each manager offers (`--resource NAME=N`)
    custom: tuple[tuple[str, int], ...] = ()

    @classmethod
    def from_serve_args(cls, args: Sequence[str]) -> Offer:
        """The `--pool`, `--capability` and `--resource` values among `flow serve` options
        (`--pool X` or `--pool=X`); anything else is left to `flow serve`."""
        found: dict[str, list[str]] = {"--pool": [], "--capability": [], "--resource": []}
        items = list(args)
        for i, arg in enumerate(items):
            name, eq, value = arg.partition("=")
            if name not in found:
                continue
            if eq:
                found[name].append(value)
            elif i + 1 < len(items):
                found[name].append(items[i + 1])
        custom: dict[str, int] = {}
        for item in found["--resource"]:
            key, n = parse_resource(item, "--serve-arg=--resource")
            custom[key] = n
        return cls(
            tuple(found["--pool"]), tuple(found["--capability"]), tuple(sorted(custom.items()))
        )

    def serves(self, sc: ServiceClass) -> bool:
        return sc.served_by(self.pools, self.capabilities)

    def why_not(self, sc: ServiceClass) -> str:
        """Why its managers do not serve a class, and the serve argument that would."""
        pool = sc.pool or DEFAULT_POOL
        if pool not in (self.pools or (DEFAULT_POOL,)):
            return (
                f"the managers it starts do not serve pool `{pool}`; pass --serve-arg=--pool={pool}"
            )
        missing = sorted(set(sc.requires) - set(self.capabilities))
        flags = " ".join(f"--serve-arg=--capability={c}" for c in missing)
        return (
            "the managers it starts do not offer "
            + ", ".join(f"`{c}`" for c in missing)
            + f"; pass {flags}"
        )


def merged_limits(
    *,
    cpus: int | None,
    gpus: int | None,
    mem: int | None,
    nodes: int,
    known: NodeLimits,
) -> NodeLimits:
    """The user's per-node limits, else what the backend knows of its nodes; the most
    nodes per allocation is the user's, never more than the backend allows."""
    sources: list[tuple[str, str]] = []
    out: dict[str, int | None] = {}
    for what, mine, flag, show in (
        ("cpus", cpus, "--cpus-per-node", str),
        ("gpus", gpus, "--gpus-per-node", str),
        ("mem", mem, "--mem-per-node", format_size),
    ):
        theirs = getattr(known, what)
        if mine is not None:
            out[what] = mine
            sources.append((what, f"{flag} {show(mine)}"))
        else:
            out[what] = theirs
            if theirs is not None:
                sources.append((what, known.source(what)))
    most = min(nodes, known.nodes) if known.nodes is not None else nodes
    return NodeLimits(out["cpus"], out["gpus"], out["mem"], max(1, most), tuple(sources))


def too_large(need: Request, limits: NodeLimits, offer: Offer) -> str | None:
    """Why one job of this request fits no node the limits allow (None: one fits)."""
    for what, asked, limit, unit in (
        ("cpus", need.cpus, limits.cpus, "CPU"),
        ("gpus", need.gpus, limits.gpus, "GPU"),
    ):
        if limit is not None and asked > limit:
            return (
                f"needs {_n(asked, unit)}; a node has at most {_n(limit, unit)} "
                f"({limits.source(what)})"
            )
    if limits.mem is not None and need.mem > limits.mem:
        return (
            f"needs {format_size(need.mem)} memory; a node has at most "
            f"{format_size(limits.mem)} ({limits.source('mem')})"
        )
    have = dict(offer.custom)
    for name, n in need.custom:
        if have.get(name, 0) < n:
            return (
                f"needs {name}={n}; the managers it starts offer {name}={have.get(name, 0)} "
                f"(pass --serve-arg=--resource={name}=N)"
            )
    return None


def fit(need: Request, jobs: int, limits: NodeLimits, offer: Offer) -> AllocationProfile | str:
    """The allocation for `jobs` jobs of one request: as many of them on a node as every
    resource they ask for allows (its per-node limit over the request; a resource without
    a limit allows one job), on as many nodes as the rest need, up to the most nodes.
    A reason instead when one job fits no node."""
    why = too_large(need, limits, offer)
    if why is not None:
        return why
    caps = [jobs]
    pairs = ((need.cpus, limits.cpus), (need.gpus, limits.gpus), (need.mem, limits.mem))
    for asked, limit in pairs:
        if asked:
            caps.append(limit // asked if limit is not None else 1)
    have = dict(offer.custom)
    caps += [have[name] // n for name, n in need.custom]
    per_node = max(1, min(caps))
    nodes = max(1, min(limits.nodes or 1, math.ceil(jobs / per_node)))
    return AllocationProfile(nodes, per_node * need.cpus, per_node * need.gpus, per_node * need.mem)


def _n(n: int, what: str) -> str:
    return f"{n} {what}" + "s" * (n != 1)


@dataclass(frozen=True)
class Group:
    """The queued and active jobs of one service class, and what is asked for them."""

    #: the class id (what allocation records name)
    service: str
    cls: ServiceClass | None
    #: queued jobs an allocation of this group fits (time and shape)
    queued: int
    #: jobs of the class that managers hold now
    active: int = 0
    #: allocations wanted for it: one per jobs-per-manager of queued and active jobs
    want: int = 0
    #: the shape to ask for (None: no allocation fits the class)
    profile: AllocationProfile | None = None
    #: the walltime to ask for (None: the backend's default)
    walltime: float | None = None
    #: of the fitting queued jobs: the shortest declared time, and whether any declares none
    shortest: float | None = None
    untimed: bool = False
    unfit: int = 0
    unfit_reason: str = ""

    def describe(self) -> str:
        return self.cls.describe() if self.cls is not None else f"service class {self.service!r}"

    def to_json(self) -> dict[str, object]:
        return {
            "service": self.service,
            "class": self.describe(),
            "queued": self.queued,
            "active": self.active,
            "want": self.want,
            "profile": self.profile.to_json() if self.profile else None,
            "shape": self.profile.describe() if self.profile else None,
            "walltime": self.walltime,
            "unfit": self.unfit,
            "unfit_reason": self.unfit_reason,
        }


def active_by_class(ws: Workspace) -> Counter[str]:
    """Jobs managers hold now, by class id, from the marker names of the active states."""
    found: Counter[str] = Counter()
    for st in State:
        if st.is_active:
            for h in walk_all(ws, st):
                found[h.marker.service] += 1
    return found


@dataclass
class Plan:
    """What one pass does to match the allocations to the groups."""

    #: groups to submit one allocation for each (a group may appear more than once)
    submit: list[Group] = field(default_factory=list)
    #: allocations no group needs (never one whose manager is busy)
    surplus: list[AllocationRecord] = field(default_factory=list)


def assign(active: Iterable[AllocationRecord], groups: Sequence[Group]) -> dict[str, str | None]:
    """Which group each active allocation counts for (by token): its own class; one of an
    older release, recorded without a class, for a group of default requests that still
    wants more (any manager runs those), else none."""
    wanted = {g.service: g for g in groups}
    out: dict[str, str | None] = {}
    have: Counter[str] = Counter()
    legacy = []
    for rec in active:
        if rec.service is None:
            legacy.append(rec)
        else:
            out[rec.token] = rec.service
            have[rec.service] += 1
    for rec in legacy:
        takes = [
            g
            for g in wanted.values()
            if g.cls is not None and g.cls.need.is_default and have[g.service] < g.want
        ]
        out[rec.token] = takes[0].service if takes else None
        if takes:
            have[takes[0].service] += 1
    return out


def plan(
    active: Sequence[AllocationRecord],
    groups: Sequence[Group],
    *,
    room: int,
    minimum: int,
    busy: set[str],
    fallback: Group,
) -> Plan:
    """Submissions (round robin over the groups with queued work, the group with the most
    first, within `room`) and surplus allocations (per group beyond its want, unstarted
    first, then the newest; never busy ones, and never below `minimum` in all)."""
    out = Plan()
    owner = assign(active, groups)
    by_group: dict[str | None, list[AllocationRecord]] = {}
    for rec in active:
        by_group.setdefault(owner[rec.token], []).append(rec)
    wants = {g.service: g.want for g in groups}
    for key, recs in by_group.items():
        extra = len(recs) - (wants.get(key, 0) if key is not None else 0)
        order = sorted(recs, key=lambda r: (r.phase is AllocPhase.RUNNING, -r.created))
        out.surplus += [r for r in order if r.token not in busy][: max(0, extra)]
    keep = len(active) - len(out.surplus)
    if keep < minimum:
        out.surplus = out.surplus[: max(0, len(out.surplus) - (minimum - keep))]
    missing = {
        g.service: max(0, g.want - len(by_group.get(g.service, [])))
        for g in groups
        if g.queued and g.profile is not None
    }
    ranked = sorted(
        (g for g in groups if missing.get(g.service)), key=lambda g: (-g.queued, g.service)
    )
    while len(out.submit) < room and any(missing[g.service] for g in ranked):
        for g in ranked:
            if missing[g.service] and len(out.submit) < room:
                out.submit.append(g)
                missing[g.service] -= 1
    short = minimum - (len(active) - len(out.surplus)) - len(out.submit)
    out.submit += [fallback] * max(0, min(short, room - len(out.submit)))
    return out
