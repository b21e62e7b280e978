"""What `flow run` leaves when it stops for want of anything it can do: work it serves
but could never do by itself, said in one line, and exit status 4."""

from __future__ import annotations

from dataclasses import dataclass

from httk_flow.manager.claim import ClaimPass
from httk_flow.protocol.durations import compact_duration
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

#: `flow run`'s exit status when it stopped with work left that it could not do
EXIT_WORK_LEFT = 4


@dataclass(frozen=True)
class Leftover:
    """Work a manager leaves when it stops because nothing it can do is left: jobs it
    serves that it could never do by itself (jobs of pools it does not serve and outside
    its placements are not its work; jobs in backoff or run elsewhere it waits for)."""

    #: ready jobs whose declared time would not end by its usable end, the longest such
    #: time, and the usable time it had left
    unfit: int = 0
    need: float = 0.0
    left: float | None = None
    #: ready jobs it could not claim (damaged: reported as problems)
    unclaimable: int = 0
    paused: int = 0
    #: joins that cannot be decided: their children are among what is left
    waiting: int = 0
    #: ready jobs that ask more than this manager has, and why (the largest such ask)
    oversize: int = 0
    oversize_why: str = ""
    #: dependents (`--after`) whose dependencies are among what is left
    after: int = 0

    def __bool__(self) -> bool:
        return bool(
            self.unfit
            or self.unclaimable
            or self.paused
            or self.waiting
            or self.oversize
            or self.after
        )

    def describe(self) -> str:
        """One line: what is left, and why."""
        parts = []
        if self.unfit:
            need = compact_duration(self.need)
            had = compact_duration(self.left or 0.0)
            parts.append(
                f"{_jobs(self.unfit, 'ready job')} "
                + (f"needs {need}" if self.unfit == 1 else f"need up to {need}")
                + f" but this manager had {had} left (give managers more time: a longer "
                "--walltime or allocation)"
            )
        if self.oversize:
            parts.append(
                f"{_jobs(self.oversize, 'ready job')} "
                + ("asks" if self.oversize == 1 else "ask")
                + f" more than this manager has ({self.oversize_why}; start one with more: "
                "--cpus, --gpus, --mem, --resource)"
            )
        if self.unclaimable:
            parts.append(
                f"{_jobs(self.unclaimable, 'ready job')} could not be claimed "
                "(see the problems above)"
            )
        if self.paused:
            parts.append(
                f"{_jobs(self.paused, 'paused job')} (`flow resume` "
                + ("continues it)" if self.paused == 1 else "continues them)")
            )
        if self.waiting:
            parts.append(f"{_jobs(self.waiting, 'waiting job')} whose children cannot finish here")
        if self.after:
            parts.append(
                f"{_jobs(self.after, 'job')} waiting for dependencies that have not ended "
                "(`flow show JOB` names them)"
            )
        return "; ".join(parts)


def _jobs(n: int, what: str) -> str:
    return f"{n} {what}{'s' * (n != 1)}"


@dataclass(frozen=True)
class ReadyLook:
    """One walk of the ready jobs a manager serves (ClaimPass.ours), made when it has
    nothing to do: whether one of them is still work for it, and if not, what of them it
    leaves. An idle `flow run` decides and reports from the same walk."""

    #: a ready job it serves and could take (in backoff, or not yet reached by its scan)
    pending: bool
    unfit: int = 0
    need: float = 0.0
    unclaimable: int = 0
    oversize: int = 0
    oversize_why: str = ""
    #: the jobs found too long for its end that are still ready
    still: frozenset[str] = frozenset()


def look_ready(claim: ClaimPass, places: tuple[str, ...], *, fresh: bool = False) -> ReadyLook:
    """Whether any ready job under `places` is still work for this manager (it stops at
    the first), else what is left there that it serves but could not take: jobs too long
    for its end, damaged, or asking more than it has. `fresh`: ClaimPass.ours."""
    unfit, unclaimable, need, oversize, why = 0, 0, 0.0, 0, ""
    still: set[str] = set()
    for h in claim.ours(places, fresh=fresh):
        if not claim.serves(h):
            too_big = claim.oversize(h)
            if too_big is not None:
                oversize += 1
                why = why or too_big
            continue
        if h.key in claim.unclaimable:
            unclaimable += 1
        elif (n := claim.need_of(h.key)) is not None:
            unfit += 1
            need = max(need, n)
            still.add(h.key)
        else:
            return ReadyLook(pending=True)
    return ReadyLook(False, unfit, need, unclaimable, oversize, why, frozenset(still))


def leftover(
    ws: Workspace, claim: ClaimPass, places: tuple[str, ...], ready: ReadyLook | None = None
) -> Leftover:
    """What is left under `places` that the claim pass serves but could not take: ready
    jobs too long for its end or damaged (`ready`: the idle check's own look, else one
    made now), paused jobs, and joins that cannot be decided (a manager stops idle only
    once its join scan went round: a join left is stuck)."""
    if ready is None or ready.pending:
        ready = look_ready(claim, places)
    claim.forget_unfit(ready.still)
    # other pools' paused and waiting jobs are passed by their names, as ready ones
    paused = sum(1 for h in claim.ours(places, State.PAUSED) if claim.serves(h))
    waiting = after = 0
    for h in claim.ours(places, State.WAITING):
        if claim.serves(h):
            if h.marker.after:
                after += 1
            else:
                waiting += 1
    ends = claim.ends_at
    left = max(0.0, ends - claim.ctx.clock()) if ends is not None else None
    return Leftover(
        ready.unfit,
        ready.need,
        left,
        ready.unclaimable,
        paused,
        waiting,
        ready.oversize,
        ready.oversize_why,
        after,
    )
