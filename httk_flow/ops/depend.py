"""`flow submit --after`: the selectors a submission names, made into dependency sets
before its first job is published (protocol.md §14)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from httk_flow.errors import FlowError, JobNotFound, UsageError
from httk_flow.ops.select import resolve_after
from httk_flow.protocol.after import MAX_AFTER, After, AfterPolicy, DependencySets
from httk_flow.protocol.handles import JobHandle
from httk_flow.protocol.jobs import load_spec
from httk_flow.protocol.release import make_set
from httk_flow.protocol.workspace import Workspace


@dataclass(frozen=True)
class Dependencies:
    """The sets one submission waits for, and how many jobs each holds."""

    after: tuple[After, ...]
    members: tuple[int, ...]


def prepare(
    ws: Workspace,
    selectors: Sequence[str],
    policy: AfterPolicy,
    *,
    actor: str,
    own_group: str | None = None,
    seed: str | None = None,
) -> Dependencies:
    """Resolve every selector now (a dependency names jobs that exist, so no cycle can
    form) and publish one set each; a selector naming no job, or the submission's own
    group, is refused before anything is written. With `seed` (a batch id) each set's id
    is derived from it and the selector, so a re-run of the batch finds the same sets."""
    if len(selectors) > MAX_AFTER:
        raise UsageError(f"at most {MAX_AFTER} may be given", obj="--after")
    resolved: list[tuple[str, list[JobHandle]]] = []
    for text in dict.fromkeys(s.strip() for s in selectors):
        if own_group is not None and text in (own_group, f"group:{own_group}"):
            raise UsageError(
                "names the group this submission joins: a job cannot wait for itself",
                obj=f"--after {text!r}",
                hint="give the new jobs another --group",
            )
        try:
            members = resolve_after(ws, text)
        except JobNotFound:
            members = []
        if not members:
            raise JobNotFound(
                "matches no job", obj=f"--after {text!r}", hint="see the jobs with `flow list`"
            )
        resolved.append((text, members))
    after = []
    for text, members in resolved:
        set_id = make_set(
            ws, text, policy, members, actor=actor, set_id=_set_id(seed, text, policy)
        )
        after.append(After(set_id, text, policy))
    return Dependencies(tuple(after), tuple(len(m) for _, m in resolved))


@dataclass(frozen=True)
class DependencyView:
    """One `--after` of a job as `flow show` tells it."""

    after: After
    members: int
    ended: dict[str, int]
    complete: bool
    broken: str | None

    def words(self) -> str:
        n = sum(self.ended.values())
        parts = ", ".join(f"{v} {k}" for k, v in sorted(self.ended.items()))
        s = f"{self.after.selector} ({self.after.policy.value}): {n} of {self.members} ended"
        if parts:
            s += f" ({parts})"
        if self.broken is not None:
            key, _, state = self.broken.partition(" ")
            s += f"; {key} {state}"
        elif self.complete:
            s += "; met"
        return s

    def to_json(self) -> dict[str, object]:
        return {
            **self.after.to_json(),
            "members": self.members,
            "ended": self.ended,
            "complete": self.complete,
            "broken": self.broken,
        }


def dependencies_of(ws: Workspace, job: JobHandle) -> list[DependencyView]:
    """Where each of a job's dependency sets stands (none: it has no --after)."""
    try:
        spec = load_spec(ws, job.placement, job.key)
    except FlowError:
        return []
    sets = DependencySets(ws)
    out = []
    for a in spec.after:
        st = sets.status(a.set, count=True)
        out.append(DependencyView(a, st.members, dict(st.ended or {}), st.complete, st.broken))
    return out


def _set_id(seed: str | None, selector: str, policy: AfterPolicy) -> str | None:
    if seed is None:
        return None
    return hashlib.sha256(f"{seed}\0{selector}\0{policy.value}".encode()).hexdigest()[:20]


#: the set id of a placeholder: a selector and policy whose set is not made yet
PLACEHOLDER = "0" * 20


def placeholders(selectors: Sequence[str], policy: AfterPolicy) -> tuple[After, ...]:
    """What a batch's digest sees of its --after (or a line's `after`) before the sets
    exist: the selectors and the policy (the sets are named after the batch once its id
    is known)."""
    return tuple(After(PLACEHOLDER, s.strip(), policy) for s in dict.fromkeys(selectors))


class BatchSets:
    """The dependency sets of one batch, one per distinct (selector, policy), named after
    the batch: placeholders made real, each set made once however many jobs name it."""

    def __init__(self, ws: Workspace, batch: str, *, actor: str) -> None:
        self.ws, self.batch, self.actor = ws, batch, actor
        self._made: dict[tuple[str, AfterPolicy], After] = {}

    def real(self, after: tuple[After, ...]) -> tuple[After, ...]:
        return tuple(self._one(a) if a.set == PLACEHOLDER else a for a in after)

    def _one(self, a: After) -> After:
        got = self._made.get((a.selector, a.policy))
        if got is None:
            [got] = prepare(
                self.ws, [a.selector], a.policy, actor=self.actor, seed=self.batch
            ).after
            self._made[(a.selector, a.policy)] = got
        return got
