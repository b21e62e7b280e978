"""The members of one journal frame as types: the snapshot, an attempt, its result, the
decision of its commit, a failure, a join, a takeover's evidence (`last`, the vocabulary
of how the job's previous activity ended, is in last.py). Each parses itself from, and
writes itself as, JSON.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from httk_flow.protocol.frame_fields import (
    BadFrame,
    Json,
    get_int,
    get_str,
    member,
    opt_int,
    opt_number,
    opt_ref,
    opt_str,
    put,
)
from httk_flow.protocol.last import Last, LastKind
from httk_flow.protocol.names import RecordRef
from httk_flow.protocol.states import State

__all__ = [
    "AttemptRecord",
    "Changes",
    "DecisionRecord",
    "Evidence",
    "Failure",
    "Join",
    "Joined",
    "Killed",
    "Last",
    "LastKind",
    "Result",
    "Snapshot",
]

# -- the snapshot every frame carries -------------------------------------------------


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The job's state between moves. `step` "" means unknown (a frame that could not be
    read when the job was failed); intr/deaths/charged/timeouts 0, last/join_ref None are
    not written (so frames of versions that did not know a member read it as 0).

    `timeouts` belongs to its activation: a snapshot of another activation (an advance, a
    join's release, a resume) starts it again at 0 unless it is given."""

    step: str = ""
    act: int = 1  # activation: +1 at every advance or join release
    try_: int = 0  # tries of this activation charged so far (the attempt's number in it)
    tries: int = 0  # attempts ever started (names the attempt directory)
    intr: int = 0  # uncharged interruptions since an operator last looked
    deaths: int = 0  # consecutive attempts whose manager died under them
    last: Last | None = None
    join_ref: RecordRef | None = None  # the waiting frame of the join that released it
    charged: int = 0  # charged failures since submission or the last resume (max_attempts)
    timeouts: int = 0  # attempts of this activation stopped at their time limit

    def but(self, **changes: Any) -> Snapshot:
        if "act" in changes and changes["act"] != self.act and "timeouts" not in changes:
            changes["timeouts"] = 0
        return dataclasses.replace(self, **changes)

    def to_json(self, d: Json) -> None:
        if self.step:
            d["step"] = self.step
        d["act"] = self.act
        d["try"] = self.try_
        d["tries"] = self.tries
        if self.intr:
            d["intr"] = self.intr
        if self.deaths:
            d["deaths"] = self.deaths
        if self.last is not None:
            d["last"] = self.last.text
        if self.join_ref is not None:
            d["join_ref"] = str(self.join_ref)
        if self.charged:
            d["charged"] = self.charged
        if self.timeouts:
            d["timeouts"] = self.timeouts

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Snapshot:
        last = opt_str(d, "last")
        return cls(
            step=get_str(d, "step", ""),
            act=get_int(d, "act", 1),
            try_=get_int(d, "try", 0),
            tries=get_int(d, "tries", 0),
            intr=get_int(d, "intr", 0),
            deaths=get_int(d, "deaths", 0),
            last=Last.parse(last) if last is not None else None,
            join_ref=opt_ref(d, "join_ref"),
            charged=get_int(d, "charged", 0),
            timeouts=get_int(d, "timeouts", 0),
        )


# -- the members of one move ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a job failed: a short code to search for, a message for people."""

    code: str
    message: str = ""
    retryable: bool = False

    def to_json(self) -> Json:
        return {"code": self.code, "message": self.message, "retryable": self.retryable}

    @classmethod
    def from_json(cls, d: Json) -> Failure:
        r = d.get("retryable", False)
        if not isinstance(r, bool):
            raise BadFrame("retryable")
        return cls(get_str(d, "code"), opt_str(d, "message") or "", r)


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One attempt: its number (and directory name), who runs it where, and its process
    once launched (pid = pgid: the launcher leads its own process group)."""

    n: int
    id: str
    manager: str
    host: str
    step: str
    pid: int | None = None
    pgid: int | None = None
    start_time: int | None = None  # the kernel's start time of pid: tells reuse apart
    dir: str | None = None
    limit: float | None = None  # seconds it may run before its group is stopped

    def launched(
        self, *, pid: int, start_time: int | None, dir: str, limit: float | None = None
    ) -> AttemptRecord:
        return dataclasses.replace(
            self, pid=pid, pgid=pid, start_time=start_time, dir=dir, limit=limit
        )

    def to_json(self) -> Json:
        d: Json = {
            "n": self.n,
            "manager": self.manager,
            "host": self.host,
            "step": self.step,
            "id": self.id,
        }
        put(d, "pid", self.pid)
        put(d, "pgid", self.pgid)
        put(d, "start_time", self.start_time)
        put(d, "dir", self.dir)
        put(d, "limit", self.limit)
        return d

    @classmethod
    def from_json(cls, d: Json) -> AttemptRecord:
        n = get_int(d, "n")
        return cls(
            n=n,
            id=get_str(d, "id", f"a{n:04d}"),
            manager=get_str(d, "manager", ""),
            host=get_str(d, "host", ""),
            step=get_str(d, "step", ""),
            pid=opt_int(d, "pid"),
            pgid=opt_int(d, "pgid"),
            start_time=opt_int(d, "start_time"),
            dir=opt_str(d, "dir"),
            limit=_opt_seconds(d, "limit"),
        )


def _opt_seconds(d: Json, k: str) -> float | None:
    v = opt_number(d, k)
    if v is not None and v < 0:
        raise BadFrame(k)
    return float(v) if v is not None else None


@dataclass(frozen=True, slots=True)
class Result:
    """How an attempt ended, as its manager observed it. `outcome` is the published
    outcome in its own format (outcome.py), recorded for people; never acted upon."""

    exit: int | None
    signal: int | None = None
    outcome: Json | None = None
    outcome_error: str | None = None
    interrupted: str | None = None  # "drain" (our own stop) or "takeover"
    time_limit: float | None = None  # stopped by its manager at this limit (seconds)
    elapsed: float | None = None  # seconds from the gate's opening to the exit, as timed

    @property
    def outcome_words(self) -> str:
        """The recorded outcome's action (and its next step), for people."""
        out = self.outcome or {}
        action, step = out.get("action"), out.get("step")
        text = str(action) if isinstance(action, str) else "?"
        return f"{text} {step}" if isinstance(step, str) and step else text

    def to_json(self) -> Json:
        d: Json = {"exit": self.exit, "signal": self.signal}
        put(d, "outcome", self.outcome)
        put(d, "outcome_error", self.outcome_error)
        put(d, "interrupted", self.interrupted)
        put(d, "time_limit", self.time_limit)
        put(d, "elapsed", self.elapsed)
        return d

    @classmethod
    def from_json(cls, d: Json) -> Result:
        out = d.get("outcome")
        if out is not None and not isinstance(out, dict):
            raise BadFrame("outcome")
        return cls(
            exit=opt_int(d, "exit", signed=True),
            signal=opt_int(d, "signal"),
            outcome=out,
            outcome_error=opt_str(d, "outcome_error"),
            interrupted=opt_str(d, "interrupted"),
            time_limit=_opt_seconds(d, "time_limit"),
            elapsed=_opt_seconds(d, "elapsed"),
        )


@dataclass(frozen=True, slots=True)
class Join:
    """What a waiting job waits for: its children of activation `act`, by label and tag,
    and the step that follows (or the one taken when the join cannot succeed)."""

    mode: str
    next: str
    on_impossible: str | None
    act: int
    children: tuple[tuple[str, str | None], ...]

    def to_json(self) -> Json:
        return {
            "mode": self.mode,
            "next": self.next,
            "on_impossible": self.on_impossible,
            "act": self.act,
            "children": [[label, tag] for label, tag in self.children],
        }

    @classmethod
    def from_json(cls, d: Json) -> Join:
        kids = d.get("children", [])
        if not isinstance(kids, list) or not all(
            isinstance(c, list)
            and len(c) == 2
            and isinstance(c[0], str)
            and (c[1] is None or isinstance(c[1], str))
            for c in kids
        ):
            raise BadFrame("children")
        return cls(
            mode=get_str(d, "mode", "all_succeeded"),
            next=get_str(d, "next", ""),
            on_impossible=opt_str(d, "on_impossible"),
            act=get_int(d, "act", 0),
            children=tuple((c[0], c[1]) for c in kids),
        )


@dataclass(frozen=True, slots=True)
class Joined:
    """How a join ended: its children counted."""

    children: int
    succeeded: int
    failed: int

    def to_json(self) -> Json:
        return {"children": self.children, "succeeded": self.succeeded, "failed": self.failed}

    @classmethod
    def from_json(cls, d: Json) -> Joined:
        return cls(get_int(d, "children", 0), get_int(d, "succeeded", 0), get_int(d, "failed", 0))


@dataclass(frozen=True, slots=True)
class Killed:
    """An orphan's process group stopped by the manager that took its job over."""

    signal: int
    by: str
    pgid: int
    at: float
    why: str

    def to_json(self) -> Json:
        return {
            "signal": self.signal,
            "by": self.by,
            "pgid": self.pgid,
            "at": self.at,
            "why": self.why,
        }

    @classmethod
    def from_json(cls, d: Json) -> Killed:
        return cls(
            get_int(d, "signal"),
            get_str(d, "by", ""),
            get_int(d, "pgid"),
            opt_number(d, "at") or 0.0,
            get_str(d, "why", ""),
        )


@dataclass(frozen=True, slots=True)
class Evidence:
    """Why an actor other than the attempt's manager moved the job: a takeover's proof
    (whose lease ended, how it knew, the orphan it killed), or a cancelled attempt's
    reaping by its own manager (exit, signal, whether the group is gone)."""

    owner: str | None = None
    evidence: str | None = None  # the liveness verdict about `owner` (leases.judge)
    host: str | None = None  # where the taker ran
    owner_evidence: str | None = None  # the verdict before the process itself was checked
    killed: Killed | None = None
    exit: int | None = None
    signal: int | None = None
    verified: str | None = None
    group_gone: bool | None = None

    def but(self, **changes: Any) -> Evidence:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> Json:
        d: Json = {}
        if self.verified is None:
            d["owner"] = self.owner
            d["evidence"] = self.evidence
            d["host"] = self.host
            put(d, "owner_evidence", self.owner_evidence)
            if self.killed is not None:
                d["killed"] = self.killed.to_json()
        else:
            d = {
                "exit": self.exit,
                "signal": self.signal,
                "verified": self.verified,
                "group_gone": self.group_gone,
            }
        return d

    @classmethod
    def from_json(cls, d: Json) -> Evidence:
        gone = d.get("group_gone")
        if gone is not None and not isinstance(gone, bool):
            raise BadFrame("group_gone")
        return cls(
            owner=opt_str(d, "owner"),
            evidence=opt_str(d, "evidence"),
            host=opt_str(d, "host"),
            owner_evidence=opt_str(d, "owner_evidence"),
            killed=member(d, "killed", Killed.from_json),
            exit=opt_int(d, "exit", signed=True),
            signal=opt_int(d, "signal"),
            verified=opt_str(d, "verified"),
            group_gone=gone,
        )


@dataclass(frozen=True, slots=True)
class Changes:
    """What a decision changes in the final frame of a commit: snapshot members (None =
    unchanged; `clear_join_ref` forgets the join that released the job) and members."""

    step: str | None = None
    act: int | None = None
    try_: int | None = None
    intr: int | None = None
    deaths: int | None = None
    charged: int | None = None
    timeouts: int | None = None
    last: Last | None = None
    clear_join_ref: bool = False
    message: str | None = None
    failure: Failure | None = None
    join: Join | None = None

    def but(self, **changes: Any) -> Changes:
        return dataclasses.replace(self, **changes)

    def snapshot(self, s: Snapshot) -> Snapshot:
        act = s.act if self.act is None else self.act
        # a time limit's count belongs to its activation (see Snapshot)
        timeouts = (s.timeouts if act == s.act else 0) if self.timeouts is None else self.timeouts
        return Snapshot(
            step=s.step if self.step is None else self.step,
            act=act,
            try_=s.try_ if self.try_ is None else self.try_,
            tries=s.tries,
            intr=s.intr if self.intr is None else self.intr,
            deaths=s.deaths if self.deaths is None else self.deaths,
            last=s.last if self.last is None else self.last,
            join_ref=None if self.clear_join_ref else s.join_ref,
            charged=s.charged if self.charged is None else self.charged,
            timeouts=timeouts,
        )

    def to_json(self) -> Json:
        d: Json = {}
        if self.message is not None:
            d["message"] = self.message
        put(d, "step", self.step)
        put(d, "act", self.act)
        put(d, "try", self.try_)
        put(d, "intr", self.intr)
        put(d, "deaths", self.deaths)
        put(d, "charged", self.charged)
        put(d, "timeouts", self.timeouts)
        if self.failure is not None:
            d["failure"] = self.failure.to_json()
        if self.join is not None:
            d["join"] = self.join.to_json()
        if self.last is not None:
            d["last"] = self.last.text
        if self.clear_join_ref:
            d["join_ref"] = None
        return d

    @classmethod
    def from_json(cls, d: Json) -> Changes:
        last = opt_str(d, "last")
        return cls(
            step=opt_str(d, "step"),
            act=opt_int(d, "act"),
            try_=opt_int(d, "try"),
            intr=opt_int(d, "intr"),
            deaths=opt_int(d, "deaths"),
            charged=opt_int(d, "charged"),
            timeouts=opt_int(d, "timeouts"),
            last=Last.parse(last) if last is not None else None,
            clear_join_ref="join_ref" in d and d["join_ref"] is None,
            message=opt_str(d, "message"),
            failure=member(d, "failure", Failure.from_json),
            join=member(d, "join", Join.from_json),
        )


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """A commit's decision, written in its committing frame so that whoever finishes the
    commit (its manager, or a taker) makes the same final move."""

    target: State
    why: str
    changes: Changes
    not_before: int = 0

    def to_json(self) -> Json:
        return {
            "target": self.target.value,
            "why": self.why,
            "body": self.changes.to_json(),
            "not_before": self.not_before,
        }

    @classmethod
    def from_json(cls, d: Json) -> DecisionRecord:
        try:
            target = State(get_str(d, "target"))
        except ValueError:
            raise BadFrame("target") from None
        body = member(d, "body", Changes.from_json)
        return cls(target, get_str(d, "why", ""), body or Changes(), get_int(d, "not_before", 0))
