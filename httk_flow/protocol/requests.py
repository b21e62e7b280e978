"""Operator requests only a job's owner can honour, as files that managers claim by rename.

A request is made for one marker generation of a job (the one the operator saw) and
applies at the job's first attempt boundary after it. Layout under .flow/requests/:

    new/<name>                   written by the CLI (write a sibling file, then rename)
    claimed/<manager>/<name>     renamed there by the one manager that took it
    done/<name>                  the retirement record: applied, or why it never can be

<name> is `<op>.<job id>.g<generation base36>.<nonce>`; listing new/ tells which jobs
have requests without opening a file. docs/protocol.md states the rules.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass

import orjson

from httk_flow.errors import FlowError, UnsafePath, UsageError
from httk_flow.protocol import layout, names
from httk_flow.protocol.fsio import atomic_write, fs
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle
from httk_flow.protocol.workspace import Workspace

OPS = ("pause", "priority")
#: a request file is a few hundred bytes; anything much larger was not written by us
MAX_REQUEST = 4096
NAME_RE = re.compile(
    r"(?P<op>[a-z]+)\.(?P<id>[0-9a-f]{32})\.g(?P<gen>[0-9a-z]{1,13})\.(?P<nonce>[0-9a-f]{8})"
)

#: states a request waits through: the attempt it was made for (or a later one) is live
WAITS_IN = frozenset({State.SUBMITTED, State.CLAIMED, State.RUNNING, State.COMMITTING})
#: reaching one of these after the request was made means it can never apply
_ENDS_PAUSE = frozenset(
    {State.PAUSED, State.FAILED, State.SUCCEEDED, State.CANCELLED, State.CANCELLING}
)
_ENDS_PRIORITY = frozenset({State.FAILED, State.SUCCEEDED, State.CANCELLED, State.CANCELLING})
_END_NAMES = {
    "pause": frozenset(s.value for s in _ENDS_PAUSE),
    "priority": frozenset(s.value for s in _ENDS_PRIORITY),
}


class InvalidRequest(FlowError):
    """A request file that is not one we wrote: it is retired with this reason."""


@dataclass(frozen=True)
class Request:
    op: str
    job_id: str
    key: str
    placement: str
    gen: int  # the marker generation the operator saw
    nonce: str
    t: float
    by: str
    priority: int | None = None

    @property
    def name(self) -> str:
        return f"{self.op}.{self.job_id}.g{names.to36(self.gen)}.{self.nonce}"

    @property
    def what(self) -> str:
        return f"priority {self.priority}" if self.op == "priority" else self.op

    def describe(self) -> str:
        return f"{self.what} of job {self.key}"

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "op": self.op,
            "job": self.job_id,
            "key": self.key,
            "placement": self.placement,
            "gen": self.gen,
            "nonce": self.nonce,
            "t": self.t,
            "by": self.by,
        }
        if self.priority is not None:
            out["priority"] = self.priority
        return out

    @classmethod
    def from_json(cls, raw: bytes, name: str) -> Request:
        """Parse a request file named `name`; its body must agree with its name."""
        where = f"request {name}"
        parsed = parse_name(name)
        if parsed is None:
            raise InvalidRequest("is not a request name", obj=repr(name))
        try:
            d = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise InvalidRequest(f"is not JSON ({e})", obj=where) from None
        if not isinstance(d, dict):
            raise InvalidRequest("is not a JSON object", obj=where)
        try:
            req = cls(
                op=_str(d, "op"),
                job_id=_str(d, "job"),
                key=_str(d, "key"),
                placement=names.check_placement(_str(d, "placement")),
                gen=_int(d, "gen"),
                nonce=_str(d, "nonce"),
                t=float(_num(d, "t")),
                by=_str(d, "by")[:100],
                priority=_int(d, "priority") if d.get("priority") is not None else None,
            )
        except UsageError as e:
            raise InvalidRequest(e.message, obj=where) from None
        key = names.KEY_RE.fullmatch(req.key)
        if key is None or key.group("id") != req.job_id:
            raise InvalidRequest("names a job key that is not its job's", obj=where)
        if (req.op, req.job_id, req.gen, req.nonce) != parsed:
            raise InvalidRequest("says something other than its name", obj=where)
        if req.op == "priority":
            if req.priority is None:
                raise InvalidRequest("is a priority request without a priority", obj=where)
            try:
                names.check_priority(req.priority)
            except UsageError as e:
                raise InvalidRequest(e.message, obj=where) from None
        return req


def _str(d: dict[str, object], k: str) -> str:
    v = d.get(k)
    if not isinstance(v, str):
        raise UsageError(f"member {k!r} must be a string")
    return v


def _int(d: dict[str, object], k: str) -> int:
    v = d.get(k)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise UsageError(f"member {k!r} must be a non-negative integer")
    return v


def _num(d: dict[str, object], k: str) -> float:
    v = d.get(k)
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise UsageError(f"member {k!r} must be a number")
    return float(v)


def parse_name(name: str) -> tuple[str, str, int, str] | None:
    """(op, job id, generation, nonce) of a request file name, or None."""
    m = NAME_RE.fullmatch(name)
    if m is None or m.group("op") not in OPS:
        return None
    gen = m.group("gen")
    if gen != names.to36(int(gen, 36)):
        return None  # one spelling per generation: no leading zeros
    return m.group("op"), m.group("id"), int(gen, 36), m.group("nonce")


# -- where requests live ------------------------------------------------------------


def new_dir(ws: Workspace) -> str:
    return layout.requests_new(ws.root)


def claimed_dir(ws: Workspace, manager: str) -> str:
    if not names.WRITER_RE.fullmatch(manager):
        raise UsageError("is not a manager id", obj=repr(manager))
    return layout.requests_claimed(ws.root, manager)


def done_dir(ws: Workspace) -> str:
    return layout.requests_done(ws.root)


def make(ws: Workspace, job: JobHandle, op: str, *, priority: int | None = None) -> Request:
    """Write a request for the job's current marker generation into new/."""
    if op not in OPS:
        raise UsageError(f"is not a request kind ({', '.join(OPS)})", obj=repr(op))
    req = Request(
        op=op,
        job_id=job.job_id,
        key=job.key,
        placement=job.placement,
        gen=job.marker.generation,
        nonce=secrets.token_hex(4),
        t=round(time.time(), 3),
        by=f"cli-{os.getpid()}@{ws.host}",
        priority=priority,
    )
    d = new_dir(ws)
    ws.ensure_dir(d)
    atomic_write(os.path.join(d, req.name), orjson.dumps(req.to_json()), durable=ws.policy.durable)
    return req


def pending_names(ws: Workspace) -> list[str]:
    """The names in new/ (one listing); entries that are not request names included."""
    try:
        return [e.name for e in fs.scandir(new_dir(ws))]
    except FileNotFoundError:
        return []


def read_request(path: str, name: str) -> Request:
    """Read and check one request file; refuses symlinks, FIFOs and foreign files."""
    try:
        raw = fs.read_bytes(path, MAX_REQUEST)
    except UnsafePath as e:
        raise InvalidRequest(e.message, obj=f"request {name}") from None
    return Request.from_json(raw, name)


# -- claiming and retiring ----------------------------------------------------------


def claim(ws: Workspace, manager: str, name: str) -> str | None:
    """Take the request by renaming it into claimed/<manager>/; None if another did first."""
    d = claimed_dir(ws, manager)
    ws.ensure_dir(d)
    src, dst = os.path.join(new_dir(ws), name), os.path.join(d, name)
    try:
        fs.rename(src, dst)
    except FileNotFoundError:
        # on NFS a retransmitted rename reports ENOENT although it happened
        return dst if os.path.lexists(dst) else None
    return dst


def release(ws: Workspace, path: str) -> None:
    """Put a claimed request back into new/ for whoever can apply it later."""
    # if this fails the request stays claimed by us until our lease ends, then goes back
    with contextlib.suppress(OSError):
        fs.rename(path, os.path.join(new_dir(ws), os.path.basename(path)))


def retire(
    ws: Workspace, path: str, name: str, req: Request | None, *, applied: bool, reason: str, by: str
) -> None:
    """Write the request's retirement record into done/, then remove the claimed file."""
    record: dict[str, object] = req.to_json() if req is not None else {"name": name}
    record.update(
        {
            "outcome": "applied" if applied else "retired",
            "reason": reason,
            "manager": by,
            "at": round(time.time(), 3),
        }
    )
    d = done_dir(ws)
    ws.ensure_dir(d)
    safe = name if parse_name(name) is not None else f"bad.{secrets.token_hex(4)}"
    atomic_write(os.path.join(d, safe), orjson.dumps(record), durable=ws.policy.durable)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        os.rmdir(path)  # an empty planted directory; a full one is left for fsck to report
    except OSError as e:
        if e.errno not in (errno.EISDIR, errno.EPERM, errno.ENOTEMPTY):
            raise


@dataclass(frozen=True)
class Verdict:
    """Whether a request can still apply; if not, whether it already did, and why not."""

    open: bool
    applied: bool = False
    reason: str = ""


def judge(ws: Workspace, job: JobHandle, req: Request) -> Verdict:
    """Check the request against the job's chain back to the generation it was made for.

    A frame since then that names it means it was applied (exactly once); a state since
    then that ends what was asked (a pause once paused or ended, any failure) closes it."""
    cur = job.marker.generation
    if req.gen > cur:
        return Verdict(False, reason=f"was made for generation {req.gen}, the job is at {cur}")
    ends = _ENDS_PAUSE if req.op == "pause" else _ENDS_PRIORITY
    ended: str | None = None
    for frame in ws.reader.chain(job.marker.ref, limit=cur - req.gen + 1):
        gen = frame.gen
        if gen <= req.gen:
            break
        if frame.body.requests is not None and req.name in frame.body.requests:
            return Verdict(False, applied=True, reason=f"applied at generation {gen}")
        if frame.to.value in _END_NAMES[req.op]:
            # keep the earliest
            ended = f"the job became {frame.to.value} at generation {gen} first"
    if ended is not None:
        return Verdict(False, reason=ended)
    if job.state in ends:
        return Verdict(False, reason=f"the job is {job.state.value}")
    return Verdict(True)


# -- reading them all (flow requests) -----------------------------------------------


@dataclass(frozen=True)
class RequestView:
    name: str
    status: str  # pending | claimed | applied | retired | invalid
    request: Request | None
    by: str = ""
    reason: str = ""
    at: float = 0.0

    def to_json(self) -> dict[str, object]:
        req = self.request
        return {
            "name": self.name,
            "status": self.status,
            "op": req.op if req else None,
            "job": req.job_id if req else None,
            "key": req.key if req else None,
            "gen": req.gen if req else None,
            "priority": req.priority if req else None,
            "made": req.t if req else None,
            "made_by": req.by if req else None,
            "manager": self.by or None,
            "reason": self.reason,
            "at": self.at or None,
        }


def views(ws: Workspace, *, done: bool = True) -> Iterator[RequestView]:
    """Every request: pending, claimed (by whom), and retired ones with their reasons."""
    for name in sorted(pending_names(ws)):
        if name.startswith("."):
            continue  # a request being written
        yield _view(os.path.join(new_dir(ws), name), name, "pending", "")
    base = layout.requests_claimed(ws.root)
    for manager in _names(base):
        for name in _names(os.path.join(base, manager)):
            yield _view(os.path.join(base, manager, name), name, "claimed", manager)
    if not done:
        return
    for name in _names(done_dir(ws)):
        if name.startswith("."):
            continue
        path = os.path.join(done_dir(ws), name)
        try:
            rec = orjson.loads(fs.read_bytes(path, MAX_REQUEST * 2))
            if not isinstance(rec, dict):
                raise InvalidRequest("is not a JSON object", obj=name)
        except (OSError, orjson.JSONDecodeError, FlowError):
            yield RequestView(name, "invalid", None, reason="unreadable retirement record")
            continue
        try:
            # a retired request that was malformed has only its name and the reason
            req: Request | None = Request.from_json(orjson.dumps(rec), name)
        except FlowError:
            req = None
        yield RequestView(
            name,
            str(rec.get("outcome", "retired")),
            req,
            by=str(rec.get("manager", "")),
            reason=str(rec.get("reason", "")),
            at=float(rec.get("at") or 0.0),
        )


def _names(d: str) -> list[str]:
    try:
        return sorted(e.name for e in fs.scandir(d))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _view(path: str, name: str, status: str, by: str) -> RequestView:
    try:
        return RequestView(name, status, read_request(path, name), by=by)
    except (OSError, FlowError) as e:
        reason = e.message if isinstance(e, FlowError) else (e.strerror or str(e))
        return RequestView(name, "invalid", None, by=by, reason=reason)
