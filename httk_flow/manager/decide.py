"""What an ended attempt means for its job: a pure function from evidence to a Decision."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from httk_flow.protocol.jobspec import JobSpec
from httk_flow.protocol.journal import Frame
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

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"exit": self.exit_code, "signal": self.signal}
        if self.outcome is not None:
            d["outcome"] = self.outcome.to_json()
        if self.outcome_error:
            d["outcome_error"] = self.outcome_error
        if self.interrupted:
            d["interrupted"] = "drain" if self.drained else "takeover"
        return d


@dataclass(frozen=True)
class Decision:
    target: State
    why: str
    body: dict[str, Any] = field(default_factory=dict)  # snapshot changes for the final frame
    not_before: int = 0
    children: tuple[ChildDef, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target.value,
            "why": self.why,
            "body": self.body,
            "not_before": self.not_before,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Decision:
        return cls(State(d["target"]), str(d["why"]), dict(d["body"]), int(d["not_before"]))


def decide(
    spec: JobSpec,
    frame: Frame,
    ending: Ending,
    *,
    now: float,
    backoff_base: float,
    backoff_cap: float,
) -> Decision:
    """The next state of a job whose current attempt ended as `ending` describes."""
    d = _decide(spec, frame, ending, now=now, backoff_base=backoff_base, backoff_cap=backoff_cap)
    if frame.get("deaths") and "deaths" not in d.body:
        # an attempt whose manager lived to its end: the run of deaths is broken
        return Decision(d.target, d.why, {**d.body, "deaths": 0}, d.not_before, d.children)
    return d


def _decide(
    spec: JobSpec,
    frame: Frame,
    ending: Ending,
    *,
    now: float,
    backoff_base: float,
    backoff_cap: float,
) -> Decision:
    step = str(frame.get("step", spec.step))
    act = int(frame.get("act", 1))
    tried = int(frame.get("try", 1))
    tries = int(frame.get("tries", 1))
    intr = int(frame.get("intr", 0))
    deaths = int(frame.get("deaths", 0))

    def failed(code: str, message: str) -> Decision:
        failure = {"code": code, "message": message, "retryable": code == "budget_exhausted"}
        return Decision(State.FAILED, code, {"failure": failure, "last": code})

    def again(why: str, *, charged: bool, counted: bool = True) -> Decision:
        if not charged and not counted:
            # a drain at walltime is how long jobs live: it counts against nothing
            return Decision(State.READY, why, {"try": max(0, tried - 1), "last": why})
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
            body = {"try": max(0, tried - 1), "intr": intr + 1, "last": why}
            if ending.owner_died:
                body["deaths"] = deaths + 1
            return Decision(State.READY, why, body)
        # interruptions are not the job's fault: they count against no budget
        if tried > spec.retries or tries - intr >= spec.max_attempts:
            budget = "retries" if tried > spec.retries else "max_attempts"
            return failed(
                "budget_exhausted",
                f"step {step} failed {tried} time(s) ({why}); the {budget} budget is spent",
            )
        delay = min(backoff_cap, backoff_base * (2 ** max(0, tried - 1)))
        return Decision(
            State.READY, why, {"last": why}, not_before=math.ceil(now + delay) if delay else 0
        )

    if ending.outcome_error is not None:
        return failed("protocol_error", ending.outcome_error)
    out = ending.outcome
    if out is None:
        if ending.interrupted:
            return again("interrupted", charged=False, counted=not ending.drained)
        if ending.exit_code == 0:
            if spec.require_outcome:
                return failed(
                    "protocol_error", f"step {step} exited 0 without publishing an outcome"
                )
            return Decision(State.SUCCEEDED, "exit_0", {"last": "succeeded"})
        what = (
            f"exit status {ending.exit_code}"
            if ending.exit_code is not None
            else f"signal {ending.signal}"
            if ending.signal
            else "ended without a trace"
        )
        return again(f"process failure: {what}", charged=True)
    msg = {"message": out.message} if out.message else {}
    match out.action:
        case Action.SUCCEED:
            return Decision(State.SUCCEEDED, "succeed", {**msg, "last": "succeeded"})
        case Action.FAIL:
            failure = {"code": out.code or "failed", "message": out.message, "retryable": False}
            return Decision(State.FAILED, "fail", {"failure": failure, "last": "failed"})
        case Action.ADVANCE:
            assert out.step is not None
            body = {
                **msg,
                "step": out.step,
                "act": act + 1,
                "try": 0,
                "last": "advanced",
                "join_ref": None,
            }
            return Decision(State.READY, "advance", body)
        case Action.RETRY:
            return again(f"retry requested: {out.message}", charged=True)
        case Action.PAUSE:
            return Decision(State.PAUSED, "pause", {**msg, "last": "paused"})
        case Action.WAIT:
            assert out.step is not None
            join = {
                "mode": out.join.value,
                "next": out.step,
                "on_impossible": out.on_impossible,
                "act": act,
                "children": [[c.label, c.tag] for c in out.children],
            }
            return Decision(
                State.WAITING,
                "wait",
                {**msg, "join": join, "last": "waiting", "join_ref": None},
                children=out.children,
            )
    raise AssertionError(out.action)
