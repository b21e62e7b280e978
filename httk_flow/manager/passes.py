"""The discovery-driven passes of a tick: register, claim, joins, and recovery of others' work.

Each pass walks its state kind through a bounded MarkerStream, so a tick's work is bounded
whatever the size of the workspace; a broken job is reported once and skipped.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from httk_flow.errors import FlowError, TransitionConflict
from httk_flow.manager.attempts import attempt_dir
from httk_flow.manager.commit import Committer
from httk_flow.manager.decide import Ending
from httk_flow.manager.launcher import group_alive, process_alive, signal_group
from httk_flow.manager.log import ManagerLog
from httk_flow.manager.owners import OwnerOracle
from httk_flow.protocol.discovery import MarkerStream
from httk_flow.protocol.frames import Evidence, Killed
from httk_flow.protocol.jobs import current_frame, load_spec, register_many
from httk_flow.protocol.jobspec import JobSpec
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle, transition
from httk_flow.protocol.workspace import Workspace


class SpecCache(OrderedDict[str, JobSpec]):
    """A bounded map of job key to parsed definition (oldest dropped first)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def __setitem__(self, key: str, value: JobSpec) -> None:
        super().__setitem__(key, value)
        if len(self) > self.size:
            self.popitem(last=False)


@dataclass
class PassContext:
    """What every pass shares: the workspace, who we are, and how to report."""

    ws: Workspace
    actor: str
    log: ManagerLog
    placements: tuple[str, ...]
    heartbeat: Callable[[], None]
    clock: Callable[[], float] = time.time
    reported: set[tuple[str, str]] = field(default_factory=set)
    #: definitions parsed at registration, kept for the claim that usually follows
    specs: SpecCache = field(default_factory=lambda: SpecCache(4096))

    def report_once(self, key: str, message: str) -> None:
        if (key, message) not in self.reported:
            if len(self.reported) > 100_000:
                self.reported.clear()
            self.reported.add((key, message))
            self.log.problem(key, message)

    def stream(
        self,
        state: State,
        rest: float = 0.5,
        rest_always: bool = False,
        names: Callable[[str], bool] | None = None,
        classes: Callable[[str], bool] | None = None,
    ) -> MarkerStream:
        """A manager's stream: it retires the empty directories it walks (ext4 never
        shrinks them, and an idle manager would reread their empty blocks forever) and
        stats, rather than lists, those that stay empty."""
        return MarkerStream(
            self.ws,
            state,
            self.placements,
            on_bad=lambda path, why: self.report_once(path, why),
            rest=rest,
            rest_always=rest_always,
            names=names,
            classes=classes,
            retire=True,
            remember=True,
        )


class RegisterPass:
    """submitted -> ready (or failed with protocol_error)."""

    def __init__(
        self,
        ctx: PassContext,
        on_ready: Callable[[JobHandle], None],
        on_failed: Callable[[JobHandle], None],
    ) -> None:
        self.ctx = ctx
        self.stream = ctx.stream(State.SUBMITTED)
        self.on_ready = on_ready
        #: a job failed for its definition (counted by `flow run` as one it ran)
        self.on_failed = on_failed

    def run(self, budget: int) -> int:
        n = 0
        batch = self.stream.next_batch(budget, self.ctx.heartbeat)
        done = register_many(self.ctx.ws, batch, actor=self.ctx.actor, specs=self.ctx.specs)
        for h, new in zip(batch, done, strict=True):
            if isinstance(new, TransitionConflict):
                continue
            if isinstance(new, FlowError):
                self.ctx.report_once(h.key, new.render())
                continue
            if new.state is State.READY:
                self.on_ready(new)
            elif new.state is State.FAILED:
                # said under --quiet too: a job that never runs must not go unmentioned
                self.on_failed(new)
                self.ctx.report_once(h.key, self._why(new))
            n += 1
        return n

    def _why(self, failed: JobHandle) -> str:
        try:
            failure = current_frame(self.ctx.ws, failed).body.failure
        except FlowError:
            failure = None
        why = failure.message if failure is not None else "its definition is invalid"
        return f"failed at registration: {why}"


#: seconds between two sweeps for abandoned work when every known manager looks alive
SWEEP_EVERY = 30.0


class RecoveryPass:
    """Work whose owner is gone: claims released, attempts recovered, commits and
    cancellations finished. Each takeover records its evidence in the frame."""

    def __init__(
        self,
        ctx: PassContext,
        oracle: OwnerOracle,
        committer: Committer,
        mine: Callable[[str], bool],
        on_cancel_mine: Callable[[str], None],
    ) -> None:
        self.ctx = ctx
        self.oracle = oracle
        self.committer = committer
        self.mine = mine
        self.on_cancel_mine = on_cancel_mine
        self.streams = {
            st: ctx.stream(st, rest=1.0, rest_always=True)
            for st in (State.CANCELLING, State.COMMITTING, State.RUNNING, State.CLAIMED)
        }
        self._sweep: set[str] | None = None  # suspects of the sweep under way
        self._marks: tuple[int, ...] = ()
        self._unsettled: set[str] = set()  # suspects still owning work in this sweep
        self._next_sweep = 0.0
        #: orphaned attempts we killed, by job key: named in the takeover's evidence
        self._killed: dict[str, Killed] = {}
        #: jobs this pass's takeovers committed to failed / succeeded (for `flow run`)
        self.failed = 0
        self.succeeded = 0

    def _count(self, final: JobHandle) -> None:
        if final.state is State.FAILED:
            self.failed += 1
        elif final.state is State.SUCCEEDED:
            self.succeeded += 1

    def run(self, budget: int) -> int:
        """Sweep the active kinds while some manager is not alive (and every
        SWEEP_EVERY seconds anyway); a sweep that finds nothing of theirs clears them."""
        now = time.monotonic()
        if self._sweep is None:
            suspects = self.oracle.suspects()
            if not suspects and now < self._next_sweep:
                return 0
            self._sweep, self._unsettled = suspects, set()
            self._marks = tuple(s.cycles for s in self.streams.values())
        n = 0
        share = max(1, budget // len(self.streams))
        for stream in self.streams.values():
            for h in stream.next_batch(share, self.ctx.heartbeat):
                try:
                    n += self._one(h)
                except TransitionConflict:
                    continue
                except FlowError as e:
                    self.ctx.report_once(h.key, e.render())
        if all(s.cycles > m for s, m in zip(self.streams.values(), self._marks, strict=True)):
            self.oracle.clear(self._sweep - self._unsettled)
            self._sweep = None
            self._next_sweep = now + SWEEP_EVERY
        return n

    def _one(self, h: JobHandle) -> int:
        ctx = self.ctx
        frame = ctx.ws.reader.frame(h.marker.ref)
        was = frame.body
        att = was.attempt
        owner = att.manager if att is not None and att.manager else None
        if h.state is State.COMMITTING and frame.by:
            # a commit is held by whoever wrote its committing frame (a taker, perhaps):
            # evidence about the attempt's first owner says nothing about the holder
            owner = frame.by
        if owner == ctx.actor:
            if h.state is State.CANCELLING and self.mine(h.key):
                self.on_cancel_mine(h.key)
            return 0
        evidence = self.oracle.gone(owner)
        if evidence is None:
            if owner is not None:
                self._unsettled.add(owner)
            return 0
        owner_evidence = evidence
        same_host = att is not None and att.host == ctx.ws.host
        pid = att.pid if att is not None else None
        if h.state in (State.RUNNING, State.CANCELLING) and pid is not None:
            if same_host:
                start_time = att.start_time if att is not None else None
                if process_alive(pid, start_time) or group_alive(pid):
                    # an orphan of a dead manager: stop it, take over once it is gone;
                    # the kill is ours and the takeover's evidence says so
                    signal_group(pid, 9)
                    self._killed.setdefault(
                        h.key,
                        Killed(
                            signal=9,
                            by=ctx.actor,
                            pgid=pid,
                            at=round(time.time(), 3),
                            why=f"orphan of manager {owner} ({evidence})",
                        ),
                    )
                    if len(self._killed) > 10_000:
                        self._killed.clear()
                    self._unsettled.add(str(owner))
                    return 0
                evidence = "process_gone"
            elif evidence != "stopped" and h.state is State.RUNNING:
                spec_workdir = self._workdir(h)
                if spec_workdir == "persistent" and not ctx.ws.policy.persistent_takeover:
                    ctx.report_once(
                        h.key,
                        "running on a silent manager's host with a "
                        "persistent workdir; not taken over on lease age alone "
                        "(see docs/operations.md)",
                    )
                    self._unsettled.add(str(owner))
                    return 0
        proof = Evidence(owner=owner, evidence=evidence, host=ctx.ws.host)
        if h.state in (State.RUNNING, State.CANCELLING) and same_host and pid is not None:
            proof = proof.but(owner_evidence=owner_evidence, killed=self._killed.pop(h.key, None))
        note = f"owner {owner} {evidence}"
        if h.state is State.CLAIMED:
            body = was.released("released: owner gone", evidence=proof)
            transition(ctx.ws, h, State.READY, body, actor=ctx.actor, note=note)
        elif h.state is State.CANCELLING:
            body = was.carry(attempt=att, why="cancelled", evidence=proof)
            transition(ctx.ws, h, State.CANCELLED, body, actor=ctx.actor, note=note)
        elif h.state is State.COMMITTING:
            self._count(self.committer.resume(h, frame, evidence=proof))
        elif h.state is State.RUNNING:
            spec = load_spec(ctx.ws, h.placement, h.key)
            # the directory is derived from the attempt number, never taken from the frame
            # a manager that died under its attempt (not one that said goodbye) counts
            # towards the job's manager deaths: a job may be what kills its managers
            died = proof.evidence != "stopped" and proof.owner_evidence != "stopped"
            ending = (
                self.committer.ending_from_dir(
                    attempt_dir(ctx.ws, h.placement, h.key, att.n),
                    None,
                    None,
                    interrupted=True,
                    owner_died=died,
                )
                if att is not None
                else Ending(None, None, interrupted=True, owner_died=died)
            )
            self._count(self.committer.commit(h, spec, was.carry(attempt=att), ending, proof))
        return 1

    def _workdir(self, h: JobHandle) -> str:
        try:
            return load_spec(self.ctx.ws, h.placement, h.key).workdir
        except FlowError:
            return "persistent"
