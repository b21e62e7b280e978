"""Comparison rows: sizes per profile, points, growth, targets, the registry and the table.

Each comparison measures httk_flow and its peers in the same repetition and returns rows
"httk_flow vs PEER": value = httk_flow's figure, baseline = the peer's, advantage = how
many times better httk_flow is, growth = cost at 10x N over cost at N for each side.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness import Bench, BenchFn, Row, median, registry

#: growth (cost at 10x N over cost at N) allowed by the targets; "flat" for first claim / RSS
GROWTH_LIMIT = 11.0
FLAT_CLAIM = 2.0
FLAT_RSS = 1.5


# -- sizes per profile -------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """Job counts per benchmark; a peer's tuple pairs position by position with flow's.

    The reference runs fewer jobs where it is slow (its rate is per job, so the rows stay
    comparable); growth is computed wherever two positions of one side are 10x apart.
    """

    submit: tuple[int, ...]
    ref_submit: tuple[int, ...]
    #: ready backlogs (first claim, manager RSS, status)
    backlogs: tuple[int, ...]
    ref_backlogs: tuple[int, ...]
    #: single-step no-op jobs: flow, HyperQueue and the xargs floors; the reference by hand / SDK
    e2e: tuple[int, ...]
    e2e_hand: tuple[int, ...]
    e2e_sdk: tuple[int, ...]
    two_step: tuple[int, ...]
    two_step_hand: tuple[int, ...]
    two_step_sdk: tuple[int, ...]
    #: children of one parent that joins them
    fanout: tuple[int, ...]
    fanout_hand: tuple[int, ...]
    fanout_sdk: tuple[int, ...]
    #: jobs run under strace -f -c, at two sizes: per-job figures are the difference over
    #: the difference in jobs, so that interpreter starts and set-up are not counted per job
    meta: tuple[int, int]
    meta_hand: tuple[int, int]
    meta_sdk: tuple[int, int]
    #: one reference run is stopped after this many seconds; its rate is what finished by then
    cap: float


SIZES = {
    "quick": Sizes(
        submit=(1_000, 10_000),
        ref_submit=(1_000, 10_000),
        backlogs=(1_000, 10_000, 100_000),
        ref_backlogs=(1_000, 10_000),
        e2e=(200, 2_000),
        e2e_hand=(20, 200),
        e2e_sdk=(3, 30),
        two_step=(100, 1_000),
        two_step_hand=(10, 100),
        two_step_sdk=(2, 20),
        fanout=(100, 1_000),
        fanout_hand=(5, 50),
        fanout_sdk=(2, 20),
        meta=(20, 200),
        meta_hand=(5, 50),
        meta_sdk=(1, 5),
        cap=120.0,
    ),
    "full": Sizes(
        submit=(1_000, 10_000, 100_000),
        ref_submit=(1_000, 10_000, 100_000),
        backlogs=(1_000, 10_000, 100_000),
        ref_backlogs=(1_000, 10_000, 100_000),
        e2e=(200, 2_000, 20_000),
        e2e_hand=(20, 200, 2_000),
        e2e_sdk=(10, 100),
        two_step=(100, 1_000, 10_000),
        two_step_hand=(10, 100, 1_000),
        two_step_sdk=(5, 50),
        fanout=(10, 100, 1_000),
        fanout_hand=(5, 50, 1_000),
        fanout_sdk=(5, 50),
        meta=(200, 2_000),
        meta_hand=(20, 200),
        meta_sdk=(2, 20),
        cap=900.0,
    ),
    "smoke": Sizes(
        submit=(100, 1_000),
        ref_submit=(100,),
        backlogs=(100, 1_000),
        ref_backlogs=(100,),
        e2e=(20, 200),
        e2e_hand=(5,),
        e2e_sdk=(2,),
        two_step=(10,),
        two_step_hand=(3,),
        two_step_sdk=(1,),
        fanout=(5,),
        fanout_hand=(3,),
        fanout_sdk=(2,),
        meta=(5, 20),
        meta_hand=(2, 5),
        meta_sdk=(1, 2),
        cap=60.0,
    ),
}


# -- points, rows, targets ----------------------------------------------------------------


@dataclass
class Point:
    """One side's samples at one job count (one sample per repetition)."""

    n: int
    samples: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def value(self) -> float:
        return median(self.samples)


def _cost(p: Point, unit: str) -> float:
    """What the growth check compares: time for a rate, the figure itself otherwise."""
    return p.n / p.value if unit.endswith("/s") else p.value


def growth(points: Sequence[Point | None], i: int, unit: str) -> float | None:
    if i == 0 or points[i] is None or points[i - 1] is None:
        return None
    a, b = points[i - 1], points[i]
    assert a is not None and b is not None
    if b.n != 10 * a.n or not a.samples or not b.samples:
        return None
    ca, cb = _cost(a, unit), _cost(b, unit)
    return cb / ca if ca else None


#: (row, is the last position) -> (target text, ok) for the main target, or None
Target = Callable[[Row, bool], tuple[str, bool | None] | None]


def at_least(factor: float, what: str) -> Target:
    def check(r: Row, last: bool) -> tuple[str, bool | None]:
        adv = r.advantage
        return f">= {factor:g}x {what}", None if adv is None else adv >= factor

    return check


def pair_rows(
    title: str,
    unit: str,
    flow: Sequence[Point],
    peers: dict[str, Sequence[Point | None]],
    *,
    better: str = "higher",
    targets: dict[str, Target] | None = None,
    flat: float | None = None,
    commands: dict[str, str] | None = None,
) -> list[Row]:
    """Rows "title: httk_flow vs PEER", one per peer and position, with growth and targets.

    Every row also checks growth (cost at 10x N over cost at N) against GROWTH_LIMIT, or
    against `flat` (first claim, RSS), for httk_flow's side; the peer's growth is shown.
    """
    rows = []
    for peer, points in peers.items():
        for i, f in enumerate(flow):
            p = points[i] if i < len(points) else None
            g = growth(flow, i, unit)
            pg = growth(points, i, unit) if p is not None else None
            have_peer = p is not None and p.samples and len(p.samples) == len(f.samples)
            row = Row(
                f"{title}: httk_flow vs {peer}",
                f.n,
                f.value,
                unit,
                baseline=p.value if p is not None and p.samples else None,
                baseline_name=peer,
                samples=list(f.samples),
                baseline_samples=list(p.samples) if have_peer and p is not None else [],
                better=better,
                baseline_n=p.n if p is not None and p.n != f.n else None,
                growth=g,
                baseline_growth=pg,
                note="; ".join(dict.fromkeys([*f.notes, *(p.notes if p is not None else [])])),
                detail={
                    **({"httk_flow": f.detail} if f.detail else {}),
                    **({peer: p.detail} if p is not None and p.detail else {}),
                },
                command=(commands or {}).get(peer, ""),
            )
            if p is None:
                row.note = "; ".join(filter(None, [row.note, f"{peer}: not run at this size"]))
            texts, oks = [], []
            t = (targets or {}).get(peer)
            res = t(row, i == len(flow) - 1) if t and p is not None else None
            if res:
                texts.append(res[0])
                oks.append(res[1])
            limit = flat if flat is not None else GROWTH_LIMIT
            texts.append(f"growth <= {limit:g}")
            oks.append(None if g is None else g <= limit)
            row.target = ", ".join(texts)
            known = [o for o in oks if o is not None]
            row.ok = None if not known else all(known)
            rows.append(row)
    return rows


#: strace -c syscall names per reported category
SYSCALL_GROUPS = {
    "rename": ("rename", "renameat", "renameat2"),
    "open/create": ("open", "openat", "openat2", "creat"),
    "stat family": (
        "stat",
        "lstat",
        "fstat",
        "newfstatat",
        "statx",
        "fstatat64",
        "access",
        "faccessat",
        "faccessat2",
    ),
    "fsync": ("fsync", "fdatasync", "sync", "syncfs", "sync_file_range"),
    "mkdir": ("mkdir", "mkdirat"),
    "unlink": ("unlink", "unlinkat", "rmdir"),
}
#: listed beside the groups, not counted in the metadata total
SYSCALL_EXTRA = {"getdents": ("getdents", "getdents64"), "execve": ("execve", "execveat")}


def strace_counts(path: str) -> dict[str, int]:
    """syscall -> calls from an `strace -c` summary (-f: all processes together)."""
    out: dict[str, int] = {}
    with open(path) as fh:
        for line in fh:
            parts = line.split()
            if len(parts) < 5 or not parts[3].isdigit() or parts[-1] == "total":
                continue
            out[parts[-1]] = out.get(parts[-1], 0) + int(parts[3])
    return out


def group_syscalls(counts: dict[str, int], jobs: int) -> dict[str, float]:
    """Per job: each category, their total ("metadata"), and the extras."""
    out = {g: sum(counts.get(s, 0) for s in names) / jobs for g, names in SYSCALL_GROUPS.items()}
    out["metadata"] = sum(out.values())
    for g, names in SYSCALL_EXTRA.items():
        out[g] = sum(counts.get(s, 0) for s in names) / jobs
    return out


# -- the registry of comparisons -------------------------------------------------------

VERSUS: dict[str, BenchFn] = {}
versus = registry(VERSUS)


#: the order comparisons run in when none is picked with --only
ORDER = (
    "vs_submit",
    "vs_claim",
    "vs_rss",
    "vs_status",
    "vs_e2e",
    "vs_two_step",
    "vs_fanout",
    "vs_meta",
)


def ordered() -> list[str]:
    return [n for n in ORDER if n in VERSUS] + [n for n in VERSUS if n not in ORDER]


def _measure(
    b: Bench,
    what: str,
    sides: dict[str, Sequence[int]],
    once: Callable[[int], dict[str, tuple[float, str, dict[str, Any]]]],
) -> dict[str, list[Point | None]]:
    """For each position, repetitions of once(i) -> {side: (value, note, detail)}."""
    longest = max(len(v) for v in sides.values())
    points: dict[str, list[Point | None]] = {
        s: [Point(v[i]) if i < len(v) else None for i in range(longest)] for s, v in sides.items()
    }
    for i in range(longest):
        label = ", ".join(f"{s} {v[i]}" for s, v in sides.items() if i < len(v))
        for got in b.repeat(f"{what} ({label})", lambda i=i: once(i)):
            for s, (value, note, detail) in got.items():
                p = points[s][i]
                assert p is not None
                p.samples.append(value)
                if note and note not in p.notes:
                    p.notes.append(note)
                if detail:
                    p.detail = detail
    return points


def _flow_points(points: dict[str, list[Point | None]]) -> list[Point]:
    out = []
    for p in points["flow"]:
        assert p is not None
        out.append(p)
    return out


# -- the table ----------------------------------------------------------------------------


def _fmt(x: float | None) -> str:
    if x is None or math.isnan(x):
        return "-"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{_fmt(x)}x"


def table(rows: list[Row]) -> str:
    head = (
        "benchmark",
        "n",
        "httk_flow",
        "peer",
        "peer n",
        "unit",
        "flow better by",
        "growth flow",
        "growth peer",
        "target",
        "ok",
        "runs",
    )
    body = [
        (
            r.name,
            f"{r.n:,}",
            _fmt(r.value),
            _fmt(r.baseline),
            f"{r.baseline_n:,}" if r.baseline_n is not None else "",
            r.unit,
            _x(r.advantage),
            _fmt(r.growth),
            _fmt(r.baseline_growth),
            r.target or "",
            "" if r.ok is None else ("ok" if r.ok else "NO"),
            str(len(r.samples)),
        )
        for r in rows
    ]
    widths = [max(len(x[i]) for x in (head, *body)) for i in range(len(head))]
    right = {1, 2, 3, 4, 6, 7, 8, 11}

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    out = [line(head), line(["-" * w for w in widths]), *(line(x) for x in body)]
    notes = [(r, r.note) for r in rows if r.note]
    if notes:
        out += ["", "notes:"]
        out += [f"  {r.name} (n={r.n:,}): {note}" for r, note in notes]
    splits = [r for r in rows if r.name.startswith("metadata") and r.detail]
    if splits:
        out += ["", "metadata syscalls per job, by kind (strace -f -c; marginal per job):"]
        cols = [*SYSCALL_GROUPS, "metadata", *SYSCALL_EXTRA, "all-in at the larger n"]
        heads = [c if len(c) < 13 else "all-in" for c in cols]
        out.append("  " + "side".ljust(38) + "".join(c.rjust(13) for c in heads))
        seen = set()
        for r in splits:
            for side, d in r.detail.items():
                if side in seen or not isinstance(d, dict) or "metadata" not in d:
                    continue
                seen.add(side)
                out.append("  " + side.ljust(38) + "".join(_fmt(d.get(c)).rjust(13) for c in cols))
    out += ["", "commands:"]
    seen_cmd = set()
    for r in rows:
        if r.command and r.command not in seen_cmd:
            seen_cmd.add(r.command)
            out.append(f"  {r.name.split(':')[0]} / {r.baseline_name}: {r.command}")
    return "\n".join(out)
