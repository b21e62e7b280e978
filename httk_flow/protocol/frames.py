"""Journal frames as types: parsed once where a frame is read, serialised once where written.

A frame is a header (which job, which move, who, when) and a body: the job's snapshot
(carried forward by every frame, so the newest frame is the job's state) and the members
of this one move (its attempt, result, decision, failure, join, evidence; members.py).
Nothing outside these modules reads a frame by string key; members this version does not
know are kept in `Body.extra` and written back unchanged. protocol.md §5 lists them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from httk_flow.errors import FlowError
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
from httk_flow.protocol.logstream import STREAMS, Streamed
from httk_flow.protocol.members import (
    AttemptRecord,
    Changes,
    DecisionRecord,
    Evidence,
    Failure,
    Join,
    Joined,
    Killed,
    Last,
    LastKind,
    Result,
    Snapshot,
)
from httk_flow.protocol.names import RecordRef
from httk_flow.protocol.states import State

__all__ = [
    "AttemptRecord",
    "BadFrame",
    "Body",
    "Changes",
    "DecisionRecord",
    "Evidence",
    "Failure",
    "Frame",
    "Join",
    "Joined",
    "Killed",
    "Last",
    "LastKind",
    "Result",
    "Snapshot",
    "check_frame",
]

# -- a frame: header and body ---------------------------------------------------------

_HEADER = ("job", "key", "placement", "from", "to", "gen", "prev", "t", "by")
_SNAPSHOT = (
    "step",
    "act",
    "try",
    "tries",
    "intr",
    "deaths",
    "last",
    "join_ref",
    "charged",
    "timeouts",
)
_MEMBERS = (
    "why",
    "message",
    "reason",
    "attempt",
    "result",
    "decision",
    "failure",
    "join",
    "joined",
    "evidence",
    "requests",
    "set_priority",
    "logs",
)
_KNOWN = frozenset(_HEADER + _SNAPSHOT + _MEMBERS)


@dataclass(frozen=True, slots=True)
class Body:
    """Everything a frame records but its header: the snapshot and this move's members."""

    snap: Snapshot = field(default_factory=Snapshot)
    why: str | None = None
    message: str | None = None
    reason: str | None = None  # an operator's words (cancel --reason)
    attempt: AttemptRecord | None = None
    result: Result | None = None
    decision: DecisionRecord | None = None
    failure: Failure | None = None
    join: Join | None = None
    joined: Joined | None = None
    evidence: Evidence | None = None
    requests: tuple[str, ...] | None = None  # request files this move applied (once)
    set_priority: int | None = None  # the priority the final frame of a commit takes
    #: where a commit streamed the attempt's output: (stream, log record) (logstream.py)
    logs: Streamed | None = None
    extra: tuple[tuple[str, Any], ...] = ()  # members a newer version wrote: kept as is

    def carry(self, **members: Any) -> Body:
        """The next frame's body: this snapshot (changed by `snap=`) and only `members`."""
        return Body(**{"snap": self.snap, **members})

    def but(self, **changes: Any) -> Body:
        return dataclasses.replace(self, **changes)

    def released(self, why: str, **members: Any) -> Body:
        """The body of a claim given back to ready before its program ran: uncharged, its
        try handed back (its attempt number, `tries`, stays used)."""
        snap = self.snap.but(try_=max(0, self.snap.try_ - 1))
        return Body(**{"snap": snap, "why": why, **members})

    def to_json(self) -> Json:
        d: Json = {}
        self.snap.to_json(d)
        put(d, "why", self.why)
        put(d, "message", self.message)
        put(d, "reason", self.reason)
        if self.attempt is not None:
            d["attempt"] = self.attempt.to_json()
        if self.result is not None:
            d["result"] = self.result.to_json()
        if self.decision is not None:
            d["decision"] = self.decision.to_json()
        if self.failure is not None:
            d["failure"] = self.failure.to_json()
        if self.join is not None:
            d["join"] = self.join.to_json()
        if self.joined is not None:
            d["joined"] = self.joined.to_json()
        if self.evidence is not None:
            d["evidence"] = self.evidence.to_json()
        if self.requests is not None:
            d["requests"] = list(self.requests)
        put(d, "set_priority", self.set_priority)
        if self.logs is not None:
            d["logs"] = {stream: str(ref) for stream, ref in self.logs}
        for k, v in self.extra:
            d.setdefault(k, v)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Body:
        reqs = d.get("requests")
        if reqs is not None and (
            not isinstance(reqs, list) or not all(isinstance(r, str) for r in reqs)
        ):
            raise BadFrame("requests")
        prio = d.get("set_priority")
        return cls(
            snap=Snapshot.from_json(d),
            why=opt_str(d, "why"),
            message=opt_str(d, "message"),
            reason=opt_str(d, "reason"),
            attempt=member(d, "attempt", AttemptRecord.from_json),
            result=member(d, "result", Result.from_json),
            decision=member(d, "decision", DecisionRecord.from_json),
            failure=member(d, "failure", Failure.from_json),
            join=member(d, "join", Join.from_json),
            joined=member(d, "joined", Joined.from_json),
            evidence=member(d, "evidence", Evidence.from_json),
            requests=tuple(reqs) if reqs is not None else None,
            # a priority out of range is ignored where it is applied, never refused here
            set_priority=prio if type(prio) is int else None,
            logs=_logs(d.get("logs")),
            extra=tuple((k, v) for k, v in d.items() if k not in _KNOWN),
        )


@dataclass(frozen=True, slots=True)
class Frame:
    """One journal frame: the move (`source` None for a job's first frame) and its body."""

    job: str
    key: str
    placement: str
    source: State | None
    to: State
    gen: int
    prev: RecordRef | None
    t: float
    by: str
    body: Body

    @property
    def snap(self) -> Snapshot:
        return self.body.snap

    def to_json(self) -> Json:
        d: Json = {"job": self.job, "key": self.key, "placement": self.placement}
        if self.source is not None:
            d["from"] = self.source.value
        d["to"] = self.to.value
        d["gen"] = self.gen
        d["prev"] = str(self.prev) if self.prev is not None else None
        d["t"] = self.t
        d["by"] = self.by
        d.update(self.body.to_json())
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Frame:
        """Parse a frame read from the journal; BadFrame names the first bad member."""
        src = opt_str(d, "from")
        try:
            source = State(src) if src is not None else None
        except ValueError:
            raise BadFrame("from") from None
        try:
            to = State(get_str(d, "to"))
        except ValueError:
            raise BadFrame("to") from None
        t = opt_number(d, "t")
        return cls(
            job=get_str(d, "job"),
            key=get_str(d, "key"),
            placement=get_str(d, "placement"),
            source=source,
            to=to,
            gen=get_int(d, "gen"),
            prev=opt_ref(d, "prev"),
            t=float(t) if t is not None else 0.0,
            by=get_str(d, "by", ""),
            body=Body.from_json(d),
        )


def check_frame(d: Mapping[str, Any]) -> str | None:
    """The first member of a raw frame that is present and of the wrong shape, or None.

    What every reader refuses; header members may be absent here (the journal's own
    tests write frames of any shape), a frame read as a Frame needs them."""
    try:
        for k in ("job", "key", "placement", "prev", "by"):
            opt_str(d, k)
        for k in ("from", "to"):
            v = opt_str(d, k)
            if v is not None and v not in _STATE_NAMES:
                raise BadFrame(k)
        opt_int(d, "gen")
        opt_number(d, "t")
        Body.from_json(d)
    except BadFrame as e:
        return e.top
    return None


_STATE_NAMES = frozenset(s.value for s in State)


def _logs(value: object) -> Streamed | None:
    """A frame's `logs` member: {"stdout": "<record ref>", ...} (protocol revision 5)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadFrame("logs")
    out = []
    for stream, text in value.items():
        if stream not in STREAMS or not isinstance(text, str):
            raise BadFrame("logs")
        try:
            out.append((stream, RecordRef.parse(text)))
        except FlowError:
            raise BadFrame("logs") from None
    return tuple(out)
