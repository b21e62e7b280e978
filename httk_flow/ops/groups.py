"""`flow groups`: every group, its jobs counted by state from marker names, and its span."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

from httk_flow.protocol.groups import GroupRegistry
from httk_flow.protocol.jobs import all_jobs
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace


@dataclass(frozen=True)
class GroupSummary:
    """One group: its name (None: a digest the registry does not name), when it was made,
    its jobs by state and when its first and last finished job ended."""

    name: str | None
    digest: str
    created: float | None
    states: Counter[State]
    first_end: float | None
    last_end: float | None

    @property
    def jobs(self) -> int:
        return sum(self.states.values())

    @property
    def finished(self) -> bool:
        return self.jobs > 0 and all(s.is_terminal for s in self.states)

    def span(self, now: float) -> tuple[float | None, bool]:
        """(seconds, whether it is still running): from creation to the last finished
        job's end, or to now while a job is not finished."""
        if self.created is None or not self.jobs:
            return None, False
        if self.finished and self.last_end is not None:
            return max(0.0, self.last_end - self.created), False
        return max(0.0, now - self.created), True

    def to_json(self) -> dict[str, object]:
        return {
            "group": self.name,
            "digest": self.digest,
            "created": self.created,
            "jobs": self.jobs,
            "states": {s.value: self.states[s] for s in State if self.states[s]},
            "first_end": self.first_end,
            "last_end": self.last_end,
        }


def group_summaries(ws: Workspace) -> list[GroupSummary]:
    """Every group of the registry (and every digest markers carry that it lacks), oldest
    first. A finished job's end is its marker's ctime: the rename that ended it."""
    reg = GroupRegistry(ws)
    counts: dict[str, Counter[State]] = {}
    ends: dict[str, tuple[float, float]] = {}
    for h in all_jobs(ws):
        d = h.marker.group_digest
        if not d:
            continue
        counts.setdefault(d, Counter())[h.state] += 1
        if h.state.is_terminal:
            try:
                t = os.stat(h.path(ws)).st_ctime
            except OSError:
                continue  # moved on (a resume of a failed job): not finished after all
            lo, hi = ends.get(d, (t, t))
            ends[d] = (min(lo, t), max(hi, t))
    out = []
    records = {r.digest: r for r in reg.all()}
    for d in [*records, *sorted(set(counts) - set(records))]:
        rec = records.get(d)
        first, last = ends.get(d, (None, None))
        out.append(
            GroupSummary(
                rec.name if rec else None,
                d,
                rec.created if rec else None,
                counts.get(d, Counter()),
                first,
                last,
            )
        )
    return out
