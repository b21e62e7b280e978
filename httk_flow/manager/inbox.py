"""A manager's side of operator requests: applied at its own commits, swept for the rest.

The owner of a running job claims that job's requests when the attempt commits and folds
them into the commit (the committing frame names them, so a commit finished by another
manager applies them too). Requests for jobs between attempts are swept by any manager:
claimed, checked against the generation they were made for, applied by one rename or
retired with the reason. Claims left by a dead manager are put back.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from httk_flow.errors import FlowError, TransitionConflict
from httk_flow.manager.decide import Decision
from httk_flow.manager.log import ManagerLog
from httk_flow.protocol import layout, requests
from httk_flow.protocol.crash import crash_point
from httk_flow.protocol.frames import Last, LastKind
from httk_flow.protocol.fsio import fs
from httk_flow.protocol.leases import read_managers, silent_for_takeover
from httk_flow.protocol.requests import InvalidRequest, Request
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle, locate_key, transition
from httk_flow.protocol.workspace import Workspace

#: how often new/ is listed: a human asked, half a second is prompt enough
REFRESH = 0.5
#: how often requests of jobs between attempts are swept, and dead claims put back
SWEEP = 2.0
REOFFER = 10.0
#: an unfinished request file (a writer died mid-write) is removed after this long
STALE_TMP = 3600.0


@dataclass(frozen=True)
class Claimed:
    path: str
    request: Request


@dataclass(frozen=True)
class Folded:
    """A commit's decision after its requests: what to record, and what to retire how."""

    decision: Decision
    priority: int | None
    applied: tuple[Claimed, ...]
    #: requests this commit does not apply: (request, applied earlier?, reason)
    closed: tuple[tuple[Claimed, bool, str], ...]


class RequestInbox:
    def __init__(
        self,
        ws: Workspace,
        manager: str,
        log: ManagerLog,
        *,
        lease_factor: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ws = ws
        self.manager = manager
        self.log = log
        self.lease_factor = lease_factor
        self.clock = clock
        #: job id -> names of its requests seen in new/ at the last listing
        self.by_job: dict[str, list[str]] = {}
        self._others: list[str] = []
        self._listed = -1e18
        self._new = requests.new_dir(ws)  # stat'ed every tick: built once
        self._sig = (0, 0)
        self._swept = -1e18
        self._reoffered = -1e18
        self._reported: set[str] = set()

    # -- listing -----------------------------------------------------------------

    def refresh(self) -> None:
        """List new/ again if it changed (one stat), and at least every REFRESH seconds."""
        now = self.clock()
        try:
            st = os.stat(self._new)
            sig = (st.st_ino, st.st_mtime_ns)
        except OSError:
            sig = (0, 0)
        # the interval is the backstop for filesystems with coarse or cached mtimes
        if sig == self._sig and now - self._listed < REFRESH:
            return
        self._sig, self._listed = sig, now
        by_job: dict[str, list[str]] = {}
        others = []
        for name in requests.pending_names(self.ws):
            parsed = requests.parse_name(name)
            if parsed is None:
                others.append(name)
            else:
                by_job.setdefault(parsed[1], []).append(name)
        self.by_job, self._others = by_job, others

    # -- at a commit of our own ----------------------------------------------------

    def claim_for(self, job_id: str) -> list[Claimed]:
        """Claim the job's pending requests; a malformed one is retired on the spot."""
        out = []
        for name in self.by_job.pop(job_id, ()):
            path = self._claim(name)
            if path is None:
                continue
            try:
                out.append(Claimed(path, requests.read_request(path, name)))
            except (InvalidRequest, OSError) as e:
                self._retire_bad(path, name, e)
        return out

    def fold(self, job: JobHandle, decision: Decision, claimed: list[Claimed]) -> Folded:
        """Apply claimed requests to the decision of the attempt that just ended."""
        priority: int | None = None
        applied: list[Claimed] = []
        closed: list[tuple[Claimed, bool, str]] = []
        for c in sorted(claimed, key=lambda c: c.request.t):
            req = c.request
            try:
                verdict = requests.judge(self.ws, job, req)
            except FlowError:
                requests.release(self.ws, c.path)  # an unreadable history: not at this commit
                continue
            why = None if verdict.open else verdict.reason
            if verdict.applied:
                closed.append((c, True, verdict.reason))  # by an earlier commit: retire only
                continue
            if why is None and decision.target in (State.SUCCEEDED, State.FAILED):
                why = f"the attempt ended the job as {decision.target.value}"
            if why is None and req.op == "pause":
                if decision.target in (State.READY, State.WAITING):
                    paused = decision.changes.but(last=Last.of(LastKind.PAUSED))
                    decision = Decision(
                        State.PAUSED, "paused by request", paused, 0, decision.children
                    )
                else:
                    why = f"the job is already going to {decision.target.value}"
            if why is None and req.op == "priority":
                priority = req.priority
            if why is None:
                applied.append(c)
            else:
                closed.append((c, False, why))
        return Folded(decision, priority, tuple(applied), tuple(closed))

    def settle(self, folded: Folded, final: JobHandle) -> None:
        """Retire the requests of a commit that reached its final marker."""
        for c in folded.applied:
            self._retire(c, True, f"applied at generation {final.marker.generation}")
        for c, earlier, why in folded.closed:
            self._retire(c, earlier, why)

    def give_back(self, folded: Folded) -> None:
        """The commit lost its marker (fenced): whoever sees the job next decides."""
        for c in (*folded.applied, *(c for c, _, _ in folded.closed)):
            requests.release(self.ws, c.path)

    # -- the sweep: requests of jobs between attempts ------------------------------

    def sweep(self, mine: Callable[[str], bool], budget: int = 200) -> int:
        """Apply or retire requests whose job no live attempt holds; returns actions."""
        now = self.clock()
        if now - self._swept < SWEEP:
            return 0
        self._swept = now
        self._sig = (0, 0)
        self.refresh()
        done = self._sweep_others()
        for job_id, names_ in list(self.by_job.items()):
            if mine(job_id):
                continue
            for name in names_:
                if done >= budget:
                    return done
                try:
                    done += self._sweep_one(name)
                except (FlowError, OSError) as e:
                    # a job whose history cannot be read: its request waits, reported once
                    msg = e.render() if isinstance(e, FlowError) else (e.strerror or str(e))
                    self._problem(name, f"cannot apply it yet: {msg}")
        return done

    def _sweep_one(self, name: str) -> int:
        path = os.path.join(requests.new_dir(self.ws), name)
        try:
            req = requests.read_request(path, name)
        except FileNotFoundError:
            return 0
        except (InvalidRequest, OSError) as e:
            claimed = self._claim(name)
            if claimed is not None:
                self._retire_bad(claimed, name, e)
            return 1
        job = locate_key(self.ws, req.placement, req.key)
        if job is not None and job.state in requests.WAITS_IN:
            return 0  # its owner folds it into the commit of the attempt
        claimed = self._claim(name)
        if claimed is None:
            return 0
        crash_point("request.after_claim")
        c = Claimed(claimed, req)
        if job is None:
            self._retire(c, False, "the job no longer exists")
            return 1
        verdict = requests.judge(self.ws, job, req)
        if not verdict.open:
            self._retire(c, verdict.applied, verdict.reason)
            return 1
        why = self._apply_now(job, req)
        if why == "":
            requests.release(self.ws, claimed)  # the job moved under us: look again later
            return 1
        crash_point("request.after_apply")
        if why is None:
            self._retire(c, True, f"applied at generation {job.marker.generation + 1}")
        else:
            self._retire(c, False, why)
        return 1

    def _apply_now(self, job: JobHandle, req: Request) -> str | None:
        """One rename for a job with no live attempt; None = applied, "" = it moved."""
        st = job.state
        if req.op == "pause" and st not in (State.READY, State.WAITING):
            return f"cannot pause a {st.value} job"
        if req.op == "priority" and st not in (State.READY, State.WAITING, State.PAUSED):
            return f"priority cannot change while a job is {st.value}"
        try:
            was = self.ws.reader.frame(job.marker.ref).body
            if req.op == "pause":
                body = was.carry(
                    snap=was.snap.but(last=Last.of(LastKind.PAUSED)),
                    join=was.join,
                    why="paused by request",
                    requests=(req.name,),
                )
                transition(self.ws, job, State.PAUSED, body, actor=self.manager, note=req.op)
            else:
                body = was.carry(
                    join=was.join, why=f"priority {req.priority}", requests=(req.name,)
                )
                transition(
                    self.ws,
                    job,
                    st,
                    body,
                    actor=self.manager,
                    priority=req.priority,
                    not_before=job.marker.not_before,
                    note=req.op,
                )
        except TransitionConflict:
            return ""
        return None

    def _sweep_others(self) -> int:
        """Entries of new/ that are not request names: half-written files and strangers."""
        done = 0
        d = requests.new_dir(self.ws)
        for name in self._others:
            path = os.path.join(d, name)
            if name.startswith("."):
                try:
                    if time.time() - os.lstat(path).st_mtime > STALE_TMP:
                        os.unlink(path)
                        done += 1
                except OSError:
                    pass
                continue
            claimed = self._claim(name)
            if claimed is not None:
                self._retire_bad(claimed, name, InvalidRequest("is not a request name"))
                done += 1
        self._others = []
        return done

    def reoffer(self) -> int:
        """Claims of managers whose lease ended go back to new/ (at most every REOFFER s)."""
        now = self.clock()
        if now - self._reoffered < REOFFER:
            return 0
        self._reoffered = now
        base = layout.requests_claimed(self.ws.root)
        try:
            holders = [e.name for e in fs.scandir(base) if e.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            return 0
        if not holders or holders == [self.manager]:
            return 0
        # a holder with no heartbeat at all never managed anything: its claims are free too;
        # on this host a dead process is evidence enough, elsewhere the takeover grace is
        live = {
            lv.info.id
            for lv in read_managers(self.ws)
            if not (
                silent_for_takeover(lv, self.lease_factor)
                or (lv.info.host == self.ws.host and not lv.alive)
            )
        }
        n = 0
        for holder in holders:
            if holder == self.manager or holder in live:
                continue
            d = os.path.join(base, holder)
            for e in fs.scandir(d):
                requests.release(self.ws, e.path)
                n += 1
            try:
                os.rmdir(d)
            except OSError:
                pass
        if n:
            self._sig = (0, 0)
            self.refresh()
        return n

    # -- retiring ----------------------------------------------------------------

    def _claim(self, name: str) -> str | None:
        """Claim one request; a filesystem error is reported, never raised into a commit."""
        try:
            return requests.claim(self.ws, self.manager, name)
        except OSError as e:
            self._problem(name, f"cannot claim it ({e.strerror or e})")
            return None

    def _problem(self, name: str, message: str) -> None:
        if name not in self._reported:
            if len(self._reported) > 10_000:
                self._reported.clear()
            self._reported.add(name)
            self.log.problem(f"request {name!r}", message)

    def _retire(self, c: Claimed, applied: bool, reason: str) -> None:
        try:
            requests.retire(
                self.ws,
                c.path,
                c.request.name,
                c.request,
                applied=applied,
                reason=reason,
                by=self.manager,
            )
        except OSError as e:
            # it stays claimed by us; when we are gone it is put back and judged again,
            # and a request already applied is then only retired
            self._problem(c.request.name, f"cannot retire it ({e.strerror or e}): {reason}")
            return
        if not applied:
            self.log.info(
                f"request {c.request.describe()} retired: {reason}", request=c.request.name
            )

    def _retire_bad(self, path: str, name: str, e: Exception) -> None:
        reason = e.message if isinstance(e, FlowError) else str(e)
        try:
            requests.retire(
                self.ws, path, name, None, applied=False, reason=reason, by=self.manager
            )
        except OSError as err:
            self._problem(name, f"cannot retire it ({err.strerror or err})")
            return
        self.log.problem(f"request {name!r}", f"retired: {reason}")
