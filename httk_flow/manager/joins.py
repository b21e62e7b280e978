"""The join pass: waiting -> ready at the next step once a join is decided (or failed, or
on to its on_impossible step, once it cannot be).

A child's end that we see re-reads its parent's join only when it can decide it; the
scan of waiting jobs reads every join again, which catches children other managers ran.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from httk_flow.errors import FlowError, TransitionConflict
from httk_flow.manager.passes import PassContext
from httk_flow.protocol.children import child_states
from httk_flow.protocol.crash import crash_point
from httk_flow.protocol.frames import Frame, Joined, Last, LastKind, Snapshot
from httk_flow.protocol.fsio import fs
from httk_flow.protocol.jobs import fail
from httk_flow.protocol.names import Marker
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle, transition
from httk_flow.protocol.workspace import Workspace


@dataclass
class _OpenJoin:
    mode: str
    unfinished: set[str]  # keys of children not finished when the join was last read
    read_at: float  # time.monotonic() of that read


#: seconds between two whole reads of one open join by the waiting scan (while busy)
JOIN_RECHECK = 2.0


class JoinPass:
    """waiting -> ready at the next step once the join is decided (or failed if impossible)."""

    def __init__(self, ctx: PassContext, on_ready: Callable[[JobHandle], None]) -> None:
        self.ctx = ctx
        self.stream = ctx.stream(State.WAITING, rest=1.0)
        self.on_ready = on_ready
        #: parent key -> its open join as last read whole: a child's end re-reads the join
        #: only when it can decide it, so a fan-out of n costs O(n), not a listing of every
        #: child at every child's end
        self._open: dict[str, _OpenJoin] = {}

    def child_ended(
        self, parent_placement: str, parent_key: str, child_key: str, state: State
    ) -> None:
        """A child of ours ended: look at its parent's join now if that can decide it.

        Children finished by other managers are not counted here; the scan of waiting
        jobs looks at every join again, so a stale count only delays, never decides."""
        known = self._open.get(parent_key)
        if known is not None:
            known.unfinished.discard(child_key)
            decisive = (
                not known.unfinished
                or (known.mode == "any_succeeded" and state is State.SUCCEEDED)
                or (known.mode == "all_succeeded" and state in (State.FAILED, State.CANCELLED))
            )
            if not decisive:
                return
        h = _waiting_marker(self.ctx.ws, parent_placement, parent_key)
        if h is None:
            return
        try:
            self._evaluate(h)
        except TransitionConflict:
            pass
        except FlowError as e:
            self.ctx.report_once(h.key, e.render())

    def run(self, budget: int, *, busy: bool = False) -> int:
        """Read the joins of waiting jobs. While `busy` (attempts of ours run), an open join
        read moments ago is skipped: our children's ends are counted down as they come.
        An idle manager reads every join each round, so deciding to exit never rests on
        a count that cannot see children other managers ran."""
        n = 0
        now = time.monotonic()
        for h in self.stream.next_batch(budget, self.ctx.heartbeat):
            if h.marker.after:
                continue  # waits for dependencies, not children: released by their ends
            known = self._open.get(h.key)
            if busy and known is not None and now - known.read_at < JOIN_RECHECK:
                continue
            try:
                n += self._evaluate(h)
            except TransitionConflict:
                continue
            except FlowError as e:
                self.ctx.report_once(h.key, e.render())
        return n

    def _evaluate(self, h: JobHandle) -> int:
        ctx = self.ctx
        frame = ctx.ws.reader.frame(h.marker.ref)
        join = frame.body.join
        if join is None:
            fail(ctx.ws, h, frame, "protocol_error", "waiting without a join", actor=ctx.actor)
            return 1
        labels = [label for label, _ in join.children]
        tags = dict(join.children)
        kids = child_states(ctx.ws, h.placement, h.key, h.job_id, join.act, labels, tags)
        states = [k.state for k in kids]
        done = [s for s in states if s is not None and s.is_terminal]
        ok = [s for s in states if s is State.SUCCEEDED]
        bad = [k for k in kids if k.state in (State.FAILED, State.CANCELLED)]
        mode = join.mode
        open_ = {k.key for k in kids if k.state is None or not k.state.is_terminal}
        if len(self._open) >= 10_000:
            self._open.clear()
        self._open[h.key] = _OpenJoin(mode, open_, time.monotonic())
        if mode == "any_succeeded":
            release, impossible = bool(ok), len(done) == len(kids) and not ok
        elif mode == "all_done":
            release, impossible = len(done) == len(kids), False
        else:
            release, impossible = len(ok) == len(kids), bool(bad)
        summary = Joined(children=len(kids), succeeded=len(ok), failed=len(bad))
        if release or impossible:
            self._open.pop(h.key, None)

        def released(step: str) -> Snapshot:
            # the next activation begins; its attempts find the children through join_ref
            return frame.snap.but(
                step=step,
                act=frame.snap.act + 1,
                try_=0,
                last=Last.of(LastKind.JOINED),
                join_ref=h.marker.ref,
            )

        if release:
            body = frame.body.carry(
                snap=released(join.next),
                why="joined",
                joined=summary,
            )
            self.on_ready(transition(ctx.ws, h, State.READY, body, actor=ctx.actor))
            crash_point("join.after_release")
            return 1
        if impossible:
            failed = ", ".join(f"{k.label} ({k.state.value if k.state else '?'})" for k in bad[:10])
            if join.on_impossible:
                body = frame.body.carry(
                    snap=released(join.on_impossible),
                    why="join impossible",
                    joined=summary,
                )
                self.on_ready(transition(ctx.ws, h, State.READY, body, actor=ctx.actor))
            else:
                fail(
                    ctx.ws,
                    h,
                    frame,
                    "dependency_failure",
                    f"children failed: {failed}" + (" ..." if len(bad) > 10 else ""),
                    actor=ctx.actor,
                )
            return 1
        return 0


def _waiting_marker(ws: Workspace, placement: str, key: str) -> JobHandle | None:
    try:
        names = [e.name for e in fs.scandir(ws.state_dir(State.WAITING, placement))]
    except OSError:
        return None
    for n in names:
        if n.startswith(key + "."):
            m = Marker.parse_or_none(n)
            if m is not None and m.key == key:
                return JobHandle(State.WAITING, placement, m)
    return None


def join_context(ws: Workspace, frame: Frame) -> dict[str, object] | None:
    """For every attempt of the step after a join: each child's label, id, state, path."""
    ref = frame.snap.join_ref
    if ref is None:
        return None
    try:
        join = ws.reader.frame(ref).body.join
        if join is None:
            return None
        kids = child_states(
            ws,
            frame.placement,
            frame.key,
            frame.job,
            join.act,
            [label for label, _ in join.children],
            dict(join.children),
        )
    except FlowError:
        return None
    return {
        "children": [
            {
                "label": k.label,
                "id": k.id,
                "state": k.state.value if k.state else "missing",
                "path": k.path,
            }
            for k in kids
        ]
    }
