"""What an ended attempt means for its job: a pure function from evidence to a Decision."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from httk_flow.protocol.frames import (
    Changes,
    DecisionRecord,
    Failure,
    Join,
    Last,
    LastKind,
    Result,
    Snapshot,
)
from httk_flow.protocol.jobspec import JobSpec, duration_words
from httk_flow.protocol.outcome import Action, ChildDef, Outcome
from httk_flow.protocol.states import State

#: uncharged interruptions of one job before it is failed rather than restarted forever
MAX_INTERRUPTIONS = 20
#: consecutive attempts during which the manager died before the job is failed: a job
#: that kills its manager (kill $PPID, or memory that makes the OOM killer pick it)
MAX_MANAGER_DEATHS = 3


@dataclass(frozen=True)
class Ending:
    """How an attempt ended, as the manager observed it."""

    exit_code: int | None  # None: killed by a signal, or not our child (unknown)
    signal: int | None = None
    outcome: Outcome | None = None
    outcome_error: str | None = None
    interrupted: bool = False  # we (drain) or a dead manager stopped it: not the job's fault
    drained: bool = False  # the interruption was our own orderly drain (walltime, signal)
    owner_died: bool = False  # taken over from a manager that died while it ran
    time_limit: float | None = None  # its manager stopped it at this limit (seconds)
    #: the launcher could not execute the program: (failure code, message); never retried
    exec_failure: tuple[str, str] | None = None
    elapsed: float | None = None  # seconds it ran, as its manager timed it

    def record(self) -> Result:
        """What the frames of the commit record about this ending."""
        return Result(
            exit=self.exit_code,
            signal=self.signal,
            outcome=self.outcome.to_json() if self.outcome is not None else None,
            outcome_error=self.outcome_error or None,
            interrupted=("drain" if self.drained else "takeover") if self.interrupted else None,
            time_limit=self.time_limit,
            elapsed=round(self.elapsed, 3) if self.elapsed is not None else None,
        )


@dataclass(frozen=True)
class Decision:
    target: State
    why: str
    changes: Changes = field(default_factory=Changes)  # what the final frame changes
    not_before: int = 0
    children: tuple[ChildDef, ...] = ()

    def record(self) -> DecisionRecord:
        return DecisionRecord(self.target, self.why, self.changes, self.not_before)

    @classmethod
    def recorded(cls, r: DecisionRecord, children: tuple[ChildDef, ...] = ()) -> Decision:
        return cls(r.target, r.why, r.changes, r.not_before, children)


def decide(
    spec: JobSpec,
    snap: Snapshot,
    ending: Ending,
    *,
    now: float,
    backoff_base: float,
    backoff_cap: float,
) -> Decision:
    """The next state of a job whose current attempt ended as `ending` describes."""
    d = _decide(spec, snap, ending, now=now, backoff_base=backoff_base, backoff_cap=backoff_cap)
    if snap.deaths and d.changes.deaths is None:
        # an attempt whose manager lived to its end: the run of deaths is broken
        return Decision(d.target, d.why, d.changes.but(deaths=0), d.not_before, d.children)
    return d


def _decide(
    spec: JobSpec,
    snap: Snapshot,
    ending: Ending,
    *,
    now: float,
    backoff_base: float,
    backoff_cap: float,
) -> Decision:
    step = snap.step or spec.step
    act, tried, intr, deaths = snap.act, snap.try_, snap.intr, snap.deaths

    def failed(code: str, message: str, changes: Changes | None = None) -> Decision:
        retryable = code in ("budget_exhausted", "time_limit")
        failure = Failure(code, message, retryable=retryable)
        return Decision(
            State.FAILED,
            code,
            (changes or Changes()).but(failure=failure, last=Last.failed(code)),
        )

    def again(why: str, *, charged: bool, counted: bool = True, limited: bool = False) -> Decision:
        last = Last.of(LastKind.INTERRUPTED) if not charged else Last.retrying(why)
        if not charged and not counted:
            # a drain at walltime is how long jobs live: it counts against nothing
            return Decision(State.READY, why, Changes(try_=max(0, tried - 1), last=last))
        if not charged:
            if ending.owner_died and deaths + 1 >= MAX_MANAGER_DEATHS:
                return failed(
                    "manager_deaths",
                    f"the manager died during {deaths + 1} consecutive attempts of step "
                    f"{step}; the job may be killing it (kill $PPID, or memory use that "
                    "makes the kernel's OOM killer choose it); resume it once the cause "
                    "is understood",
                )
            if intr + 1 >= MAX_INTERRUPTIONS:
                return failed(
                    "interrupted_too_often",
                    f"the job was interrupted {intr + 1} times by managers that died under "
                    "it; resume it once the cause is understood",
                )
            changes = Changes(try_=max(0, tried - 1), intr=intr + 1, last=last)
            if ending.owner_died:
                changes = changes.but(deaths=deaths + 1)
            return Decision(State.READY, why, changes)
        # a charged failure: of this activation's tries (--retries) and of the job's life
        # (max_attempts). Interruptions, drains, advances and joins count against neither.
        counts = Changes(charged=snap.charged + 1, timeouts=snap.timeouts + 1 if limited else None)
        if tried > spec.retries or snap.charged + 1 >= spec.max_attempts:
            if tried > spec.retries:
                budget = f"retries budget ({spec.retries} per activation)"
            else:
                budget = f"max_attempts budget ({spec.max_attempts} failed attempts)"
            return failed(
                "time_limit" if limited else "budget_exhausted",
                f"step {step} failed {tried} time(s) in this activation ({why}); "
                f"the {budget} is spent",
                counts,
            )
        delay = min(backoff_cap, backoff_base * (2 ** max(0, tried - 1)))
        return Decision(
            State.READY,
            why,
            counts.but(last=last),
            not_before=math.ceil(now + delay) if delay else 0,
        )

    if ending.exec_failure is not None:
        # the program never ran: no try of it can go differently, so none is made
        return failed(*ending.exec_failure)
    if ending.outcome_error is not None:
        return failed("protocol_error", ending.outcome_error)
    out = ending.outcome
    if out is None:
        if ending.interrupted:
            return again("interrupted", charged=False, counted=not ending.drained)
        if ending.time_limit is not None:
            # stopped at its limit, whatever its exit status: it did not finish
            limit = duration_words(ending.time_limit)
            return again(f"time limit {limit} reached", charged=True, limited=True)
        if ending.exit_code == 0:
            if spec.require_outcome:
                return failed(
                    "protocol_error", f"step {step} exited 0 without publishing an outcome"
                )
            return Decision(State.SUCCEEDED, "exit_0", Changes(last=Last.of(LastKind.SUCCEEDED)))
        what = (
            f"exit status {ending.exit_code}"
            if ending.exit_code is not None
            else f"signal {ending.signal}"
            if ending.signal
            else "ended without a trace"
        )
        return again(f"process failure: {what}", charged=True)
    said = Changes(message=out.message or None)
    match out.action:
        case Action.SUCCEED:
            return Decision(State.SUCCEEDED, "succeed", said.but(last=Last.of(LastKind.SUCCEEDED)))
        case Action.FAIL:
            failure = Failure(out.code or "failed", out.message)
            return Decision(
                State.FAILED, "fail", said.but(failure=failure, last=Last.of(LastKind.FAILED))
            )
        case Action.ADVANCE:
            assert out.step is not None
            advance = said.but(
                step=out.step,
                act=act + 1,
                try_=0,
                last=Last.of(LastKind.ADVANCED),
                clear_join_ref=True,
            )
            return Decision(State.READY, "advance", advance)
        case Action.RETRY:
            return again(f"retry requested: {out.message}", charged=True)
        case Action.PAUSE:
            return Decision(State.PAUSED, "pause", said.but(last=Last.of(LastKind.PAUSED)))
        case Action.WAIT:
            assert out.step is not None
            join = Join(
                mode=out.join.value,
                next=out.step,
                on_impossible=out.on_impossible,
                act=act,
                children=tuple((c.label, c.tag) for c in out.children),
            )
            return Decision(
                State.WAITING,
                "wait",
                said.but(join=join, last=Last.of(LastKind.WAITING), clear_join_ref=True),
                children=out.children,
            )
    raise AssertionError(out.action)
