"""Committing an ended attempt in two renames: running -> committing -> its final state.

The committing frame records the whole decision, so a commit interrupted between the
renames is finished by whichever manager takes the committing marker over, and the
side effects in between (child registration) are idempotent. A plain success of our own
attempt has nothing in between: it is committed in one rename, running -> succeeded.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable

from httk_flow.errors import CorruptRecord, FlowError, InvalidOutcome, UnsafePath, UsageError
from httk_flow.manager.attempts import attempt_dir
from httk_flow.manager.decide import Decision, Ending, decide
from httk_flow.manager.inbox import Folded, RequestInbox
from httk_flow.manager.log import ManagerLog
from httk_flow.manager.tidy import Tidy
from httk_flow.protocol import staging
from httk_flow.protocol.children import child_id, child_placement
from httk_flow.protocol.crash import crash_point
from httk_flow.protocol.frames import Body, Evidence, Failure, Frame, Last, Result, Snapshot
from httk_flow.protocol.jobs import load_spec
from httk_flow.protocol.jobspec import JobSpec, ParentRef
from httk_flow.protocol.logstream import LogWriter, Streamed
from httk_flow.protocol.names import MAX_PRIORITY
from httk_flow.protocol.outcome import MAX_MESSAGE, ChildDef, TornOutcome, read_outcome
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.transition import JobHandle, transition
from httk_flow.protocol.workspace import Workspace


class Committer:
    def __init__(
        self,
        ws: Workspace,
        actor: str,
        log: ManagerLog,
        clock: Callable[[], float] = time.time,
        inbox: RequestInbox | None = None,
    ) -> None:
        self.ws = ws
        self.actor = actor
        self.log = log
        self.clock = clock
        self._submitter = Submitter(ws, actor=actor)
        #: operator requests (pause, priority) folded into the commits of our attempts
        self.inbox = inbox
        #: keeps our lease alive while a commit registers thousands of children
        self.heartbeat: Callable[[], None] = lambda: None
        #: our log segments (policy `logs: stream`), opened at the first streamed output
        self._logs: LogWriter | None = None

    def ending_from_dir(
        self,
        attempt_dir: str,
        exit_code: int | None,
        sig: int | None,
        *,
        interrupted: bool = False,
        drained: bool = False,
        owner_died: bool = False,
    ) -> Ending:
        """Read the attempt's published outcome (if any) into an Ending."""
        try:
            out = read_outcome(attempt_dir)
            # no outcome: was there an attempt directory at all? (asked only then: an
            # outcome read is one found in it)
            if out is None and not os.path.isdir(attempt_dir):
                gone = f"the attempt directory {attempt_dir} vanished while it ran"
                return Ending(exit_code, sig, None, gone)
        except TornOutcome as e:
            if sig is not None or exit_code is None:
                # killed, or taken over (its writer may be cut short or still writing):
                # the part written is no outcome; the ending is what it would be without
                self.log.info(f"{attempt_dir}: {e.render()}; taken as no outcome")
                out = None
            else:
                return Ending(exit_code, sig, None, e.render())
        except InvalidOutcome as e:
            return Ending(exit_code, sig, None, e.render())
        self.heartbeat()  # a fan-out's children file can take a while to parse
        return Ending(
            exit_code,
            sig,
            out,
            None,
            interrupted=interrupted and out is None,
            drained=drained,
            owner_died=owner_died and out is None,
        )

    def commit(
        self,
        job: JobHandle,
        spec: JobSpec,
        running: Body,
        ending: Ending,
        evidence: Evidence | None = None,
        tidy: Tidy | None = None,
    ) -> JobHandle:
        """running (or cancelling-free running) -> committing -> final. `running` is the
        body of the job's running frame. Raises TransitionConflict when the attempt was
        fenced (cancelled, taken over) before it could commit. `tidy`: the attempt's files
        to tidy once the committing frame holds what they said (tidy.py)."""
        decision = decide(
            spec,
            running.snap,
            ending,
            now=self.clock(),
            backoff_base=self.ws.policy.backoff_base,
            backoff_cap=self.ws.policy.backoff_cap,
        )
        inbox = self.inbox
        folded: Folded | None = None
        # the tick listed the requests (when their directory changed) just before reaping
        if inbox is not None and spec.id in inbox.by_job:
            folded = inbox.fold(job, decision, inbox.claim_for(spec.id))
            decision = folded.decision
        body = running.carry(
            attempt=running.attempt,
            result=ending.record(),
            decision=decision.record(),
            why=decision.why,
            evidence=evidence,
        )
        if folded is not None:
            # named in the frame, so whoever finishes this commit applies them, and only once
            body = body.but(
                requests=tuple(c.request.name for c in folded.applied),
                set_priority=folded.priority,
            )
        final: JobHandle | None = None
        try:
            if evidence is None and _plain_success(decision):
                # a refused succeeded/ directory leaves the job running: the two renames
                # then fail it from committing (unsafe_path), as for any other commit
                with contextlib.suppress(UnsafePath):
                    final = self._direct(job, body, decision, tidy)
            if final is None:
                committing = transition(self.ws, job, State.COMMITTING, body, actor=self.actor)
        except FlowError:
            if inbox is not None and folded is not None:
                inbox.give_back(folded)
            raise
        if final is None:
            crash_point("commit.after_committing")
            final = self.finish(committing, spec, body, decision, tidy)
        if inbox is not None and folded is not None:
            inbox.settle(folded, final)
        return final

    def _direct(
        self, job: JobHandle, body: Body, decision: Decision, tidy: Tidy | None
    ) -> JobHandle:
        """running -> succeeded in one frame that holds the whole commit (protocol.md §10,
        The direct commit); tidied after the rename, since no attempt follows."""
        streamed: Streamed = ()
        stream = self.logs if tidy is not None else None
        if tidy is not None and stream is not None:
            streamed = tidy.stream_only(stream)  # named by the frame, so appended first
        c = decision.changes
        prio = body.set_priority
        final = transition(
            self.ws,
            job,
            State.SUCCEEDED,
            body.but(
                snap=c.snapshot(body.snap),
                message=c.message,
                failure=c.failure,
                logs=streamed or None,
            ),
            actor=self.actor,
            priority=prio if prio is not None and 0 <= prio <= MAX_PRIORITY else None,
        )
        crash_point("commit.after_direct")
        if tidy is not None:
            tidy.run(terminal=True, outcome=_whole(body.result), streamed=streamed)
        return final

    def resume(self, job: JobHandle, frame: Frame, evidence: Evidence | None = None) -> JobHandle:
        """Take over a committing marker whose holder is gone, then finish its commit."""
        was = frame.body
        body = was.carry(
            attempt=was.attempt,
            result=was.result,
            decision=was.decision,
            why="commit resumed",
            requests=was.requests,
            set_priority=was.set_priority,
            evidence=evidence,
        )
        mine = transition(self.ws, job, State.COMMITTING, body, actor=self.actor, note="taken over")
        # a holder that died registering children left its staging directories: no live
        # submitter owns them, and nobody else would remove them (staging.removable)
        staging.sweep(self.ws.tmp, self.clock())
        return self.finish_recorded(mine, body)

    def finish_recorded(self, mine: JobHandle, body: Body) -> JobHandle:
        """Finish the commit a committing frame's `body` records, from a marker we hold
        (after a takeover, or after a transient error interrupted our own commit)."""
        try:
            spec = load_spec(self.ws, mine.placement, mine.key)
            if body.decision is None:
                raise InvalidOutcome("the committing frame has no decision", obj=mine.key)
        except FlowError as e:
            failure = Failure("protocol_error", str(e))
            return transition(
                self.ws,
                mine,
                State.FAILED,
                body.carry(failure=failure, why="protocol_error"),
                actor=self.actor,
            )
        decision = Decision.recorded(body.decision)
        if decision.target is State.WAITING:
            # the children live in the attempt's outcome; read them again
            n = body.attempt.n if body.attempt is not None else None
            self.heartbeat()
            try:
                out = (
                    read_outcome(attempt_dir(self.ws, mine.placement, mine.key, n))
                    if n is not None
                    else None
                )
            except InvalidOutcome:
                out = None
            self.heartbeat()
            decision = Decision.recorded(body.decision, out.children if out else ())
        return self.finish(mine, spec, body, decision)

    def finish(
        self,
        committing: JobHandle,
        spec: JobSpec,
        body: Body,
        decision: Decision,
        tidy: Tidy | None = None,
    ) -> JobHandle:
        """The final rename of a commit whose committing frame has `body`."""
        if decision.children:
            try:
                self._register_children(spec, body.snap, decision.children)
            except (UsageError, InvalidOutcome, CorruptRecord) as e:
                # children that can never be registered: the commit can never complete
                return self._fail_commit(committing, body, e)
            crash_point("commit.after_children")
        streamed: Streamed = ()
        terminal = decision.target.is_terminal
        if tidy is not None and not decision.children and decision.changes.join is None:
            # a wait's children are read again from its outcome.ready/ if this commit is
            # resumed (also when a folded pause turned it into one to paused): never tidied
            streamed = tidy.run(terminal=terminal, outcome=_whole(body.result), stream=self.logs)
            crash_point("commit.after_tidy")
        c = decision.changes
        final_body = body.carry(
            snap=c.snapshot(body.snap),
            why=decision.why,
            message=c.message,
            failure=c.failure,
            join=c.join,
            result=body.result,
            attempt=body.attempt,
            evidence=body.evidence,
            requests=body.requests,
            logs=streamed or None,
        )
        prio = body.set_priority
        final = transition(
            self.ws,
            committing,
            decision.target,
            final_body,
            actor=self.actor,
            priority=prio if prio is not None and 0 <= prio <= MAX_PRIORITY else None,
            not_before=decision.not_before,
        )
        crash_point("commit.after_final")
        if streamed and tidy is not None:
            # the final frame says where the output is: only now may its files go (a
            # crash before leaves them, and flow logs reads the files first)
            tidy.drop(streamed, terminal=terminal)
        return final

    @property
    def logs(self) -> LogWriter | None:
        """Where output is streamed at commits; None unless the workspace's policy is
        `logs: stream`."""
        if self.ws.policy.logs != "stream":
            return None
        if self._logs is None:
            writer = self.ws.writer
            if not writer.writer_id:
                return None  # nothing appended yet: no commit can be streaming
            self._logs = LogWriter(
                self.ws.root,
                writer.writer_id,
                durable=self.ws.policy.durable,
                segment_bytes=self.ws.policy.segment_bytes,
            )
        return self._logs

    def _fail_commit(self, committing: JobHandle, body: Body, err: FlowError) -> JobHandle:
        message = f"the commit cannot complete: {err.render()}"[:4000]
        failed = body.carry(
            snap=body.snap.but(last=Last.failed("commit_error")),
            failure=Failure("commit_error", message),
            why="commit_error",
            attempt=body.attempt,
            result=body.result,
            evidence=body.evidence,
            requests=body.requests,
        )
        final = transition(self.ws, committing, State.FAILED, failed, actor=self.actor)
        self.log.problem(committing.key, message)
        return final

    def _register_children(
        self, spec: JobSpec, snap: Snapshot, children: tuple[ChildDef, ...]
    ) -> None:
        act = snap.act
        placement = child_placement(spec.placement, spec.key)
        job_dir = self.ws.job_dir(spec.placement, spec.key)
        reqs = []
        self.heartbeat()
        for c in children:
            program = spec.program if c.program is None else _child_program(job_dir, c.program)
            reqs.append(
                SubmitRequest(
                    program=program,
                    args=list(spec.args) if c.program is None else [],
                    tag=c.tag,
                    step=c.step,
                    params=dict(c.params),
                    priority=c.priority if c.priority is not None else spec.priority,
                    placement=placement,
                    pool=spec.pool,
                    requires=list(spec.requires),
                    resources=c.request_over(spec.resources),
                    retries=spec.retries,
                    max_attempts=spec.max_attempts,
                    workdir=spec.workdir,
                    require_outcome=spec.require_outcome,
                    parent=ParentRef(spec.id, spec.key, spec.placement, act, c.label),
                    job_id=child_id(spec.id, act, c.label),
                    group=spec.group,  # a campaign's children count in its group
                )
            )
        # every child is validated before the first is published: all or nothing
        specs = []
        for i, r in enumerate(reqs):
            if i % 256 == 0:
                self.heartbeat()  # cheap unless due: a lease outlives any registration
            specs.append(self._submitter.build(r))
        self.heartbeat()
        for _ in self._submitter.publish(
            zip(specs, reqs, strict=True), idempotent=True, progress=lambda _n: self.heartbeat()
        ):
            pass


#: errors a live owner waits out (a full disk, a hiccup of the shared filesystem)
TRANSIENT_ERRNOS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EIO,
        errno.EAGAIN,
        errno.EINTR,
        errno.ESTALE,
        errno.ENOMEM,
        errno.EMFILE,
        errno.ENFILE,
        errno.EBUSY,
        errno.ETIMEDOUT,
        errno.EROFS,
        errno.EACCES,
        errno.EPERM,
    }
)


def is_transient(err: BaseException) -> bool:
    """Whether a commit that failed with `err` may succeed later: an OS error in its chain
    that time or an operator can fix; bad definitions never become good."""
    seen: BaseException | None = err
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, UsageError | InvalidOutcome | CorruptRecord):
            return False
        if isinstance(seen, OSError):
            return seen.errno in TRANSIENT_ERRNOS or seen.errno is None
        seen = seen.__cause__ or seen.__context__
    return False


def _child_program(job_dir: str, program: str) -> str:
    return program if os.path.isabs(program) else os.path.join(job_dir, program)


def _plain_success(decision: Decision) -> bool:
    """A decision committed in one rename: success, with nothing to register or join."""
    return (
        decision.target is State.SUCCEEDED
        and not decision.children
        and decision.changes.join is None
    )


def _whole(result: Result | None) -> bool:
    """Whether the frames hold the attempt's published outcome whole: accepted, and its
    message short enough never to have been cut (so its file holds nothing more)."""
    if result is None or result.outcome is None or result.outcome_error:
        return False
    message = result.outcome.get("message")
    return not isinstance(message, str) or len(message) < MAX_MESSAGE
