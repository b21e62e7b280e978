"""The claim pass: ready -> claimed for the jobs this manager serves, packed into what it
has free.

Candidates wait in one heap per service class, and a class carries its resource request,
so whether a job fits is known from its marker name. The best candidate that fits is
claimed first; a large job that does not fit lets smaller ones past (backfill) until it
has waited RESERVE_AFTER, and from then on what it needs is kept back as it frees up.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field

from httk_flow.errors import FlowError, TransitionConflict
from httk_flow.manager.commit import is_transient
from httk_flow.manager.passes import PassContext
from httk_flow.manager.slots import RESERVE_AFTER, Binding, Slots
from httk_flow.protocol.counting import markers_wanted
from httk_flow.protocol.crash import crash_point
from httk_flow.protocol.frames import AttemptRecord, Body, Frame
from httk_flow.protocol.jobs import fail, load_spec
from httk_flow.protocol.jobspec import JobSpec
from httk_flow.protocol.names import attempt_name, marker_service
from httk_flow.protocol.resources import DEFAULT_REQUEST, Request
from httk_flow.protocol.services import ServiceRegistry
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle, transition

#: candidates kept per service class; more wait for a later scan
CLASS_CAP = 4096


#: a candidate's place in the claim order (-priority, rank, arrival): lower goes first
Sort = tuple[int, int, int]


@dataclass(order=True)
class _Candidate:
    sort: Sort
    handle: JobHandle = field(compare=False)
    #: when this manager first offered it (the clock of the pass context)
    since: float = field(compare=False, default=0.0)


@dataclass(frozen=True)
class Claimed:
    handle: JobHandle
    spec: JobSpec
    body: Body  # of the claimed frame
    ready_frame: Frame
    #: the resources it holds here (None: a manager without an inventory, in tests)
    binding: Binding | None = None
    #: its place in the claim order when it was claimed
    sort: Sort = (0, 0, 0)


#: the generation of a marker that just became ready for the first time (submitted is 0)
FIRST_READY = 1
#: ranks of a candidate among jobs of one priority, depth-first (lower is claimed first):
#: a job this manager's own commit or join release just made ready, one that was ready
#: before (it advanced, was retried or interrupted, or its join released elsewhere), new
OWN, AGAIN, NEW = 0, 1, 2
#: seconds before a job found too long for this manager's end is looked at again
TOO_LONG_RECHECK = 60.0


class ClaimPass:
    """ready -> claimed for jobs this manager may serve, best priority first.

    Within one priority the order is depth-first by default: work already under way
    (continuations) before new work, and of that, what this manager's own commits moved
    on first (its node-local files and caches are warm); `order="breadth"` takes jobs of
    one priority in the order they came."""

    def __init__(
        self,
        ctx: PassContext,
        pools: tuple[str, ...],
        caps: tuple[str, ...],
        ends_at: float | None,
        order: str = "depth",
        slots: Slots | None = None,
        reserve_after: float = RESERVE_AFTER,
    ) -> None:
        self.ctx = ctx
        self.pools, self.caps = pools, caps
        #: service class id -> whether its pool and capabilities are ours (by name alone)
        self._ours: dict[str, bool] = {}
        # other pools' markers are passed by at the cost of a string search each, and a
        # pass that found none of ours rests: a foreign backlog costs an idle scan little
        self.stream = ctx.stream(State.READY, names=self.wants_name, classes=self.wants_class)
        self.ends_at = ends_at
        self.depth_first = order != "breadth"
        self.registry = ServiceRegistry(ctx.ws)
        #: what is free here (None: every job fits, as for a manager of one slot kind)
        self.slots = slots
        self.reserve_after = reserve_after
        #: candidates by service class id: one request per class, so one fit test per heap
        self._heaps: dict[str, list[_Candidate]] = {}
        # in backoff, by not-before: (not_before, seq, rank, handle)
        self._later: list[tuple[int, int, int, JobHandle]] = []
        self._queued: set[tuple[str, int]] = set()
        self._seq = 0
        #: job key -> (when to look again, the time it declared): too long for our end
        self._too_long: dict[str, tuple[float, float]] = {}
        #: ready jobs this manager reported it cannot claim (damaged): not pending work
        self.unclaimable: set[str] = set()
        #: service class id -> why its jobs can never fit this manager's inventory
        self.too_big: dict[str, str] = {}
        #: the request of the job that keeps back what it needs (None: none waits so long)
        self.reserving: Request | None = None

    def wants_name(self, name: str) -> bool:
        """Whether a marker name may be of a job this manager serves, from its class field
        alone: False only for a known class of a pool or capabilities not ours (an unknown
        or unreadable class passes, so `serves` reports it)."""
        return self.wants_class(marker_service(name))

    def wants_class(self, cid: str) -> bool:
        """Whether jobs of service class `cid` may be ours (see wants_name): a class
        directory it refuses is never listed."""
        ours = self._ours.get(cid)
        if ours is None:
            sc = self.registry.get(cid)
            if sc is None:
                return True
            ours = self._ours[cid] = sc.served_by(self.pools, self.caps)
        return ours

    def ours(
        self, places: tuple[str, ...], state: State = State.READY, *, fresh: bool = False
    ) -> Iterator[JobHandle]:
        """Ready (or `state`) jobs under `places` whose names say they may be ours (see
        wants_name): what an idle check walks instead of every ready marker, passing by
        whole directories of classes known not to be ours with one count per class.
        `fresh`: every directory listed, none taken as remembered (markers_wanted)."""
        # shares what this pass's own stream knows of directories holding nothing of ours
        memory = self.stream if state is State.READY else None
        ws, wants = self.ctx.ws, self.wants_name
        return markers_wanted(ws, state, places, wants, self._foreign, memory, not fresh)

    def _foreign(self) -> list[str]:
        return [cid for cid, ours in self._ours.items() if not ours]

    def serves(self, h: JobHandle) -> bool:
        sc = self.registry.get(h.marker.service)
        if sc is None:
            self.ctx.report_once(h.key, f"unknown service class {h.marker.service!r}")
            return False
        if not sc.served_by(self.pools, self.caps):
            return False
        if self.slots is not None and not sc.need.is_default:
            why = self.slots.inventory.lacks(sc.need)
            if why is not None:
                self.too_big[h.marker.service] = why
                return False
        return True

    def oversize(self, h: JobHandle) -> str | None:
        """Why a ready job of a class this manager serves could never fit here (None: it
        can, or it is not of a class it serves)."""
        sc = self.registry.get(h.marker.service)
        if sc is None or not sc.served_by(self.pools, self.caps):
            return None
        return self.too_big.get(h.marker.service)

    def _need(self, cid: str) -> Request:
        sc = self.registry.get(cid)
        return sc.need if sc is not None else DEFAULT_REQUEST

    def _rank(self, h: JobHandle, own: bool) -> int:
        if not self.depth_first:
            return NEW
        if own:
            return OWN
        return AGAIN if h.marker.generation > FIRST_READY else NEW

    def offer(self, h: JobHandle, own: bool = False) -> None:
        """A ready job: queued as a candidate (once per marker generation). `own`: this
        manager's own commit or join release made it ready (claimed first, depth-first)."""
        ident = (h.key, h.marker.generation)
        if ident in self._queued or not self.serves(h):
            return
        heap = self._heaps.setdefault(h.marker.service, [])
        if len(heap) >= CLASS_CAP and not own:
            return  # enough of this class in hand: a later scan offers it again
        self._queued.add(ident)
        self._seq += 1
        rank = self._rank(h, own)
        if h.marker.not_before > self.ctx.clock():
            heapq.heappush(self._later, (h.marker.not_before, self._seq, rank, h))
        else:
            self._push(_Candidate((-h.marker.priority, rank, self._seq), h, self.ctx.clock()))

    def _push(self, c: _Candidate) -> None:
        heapq.heappush(self._heaps.setdefault(c.handle.marker.service, []), c)

    def offer_own(self, h: JobHandle) -> None:
        self.offer(h, own=True)

    def refill(self, budget: int) -> None:
        for h in self.stream.next_batch(budget, self.ctx.heartbeat):
            self.offer(h)

    @property
    def candidates(self) -> int:
        return sum(len(h) for h in self._heaps.values())

    def _pick(self, now: float, ahead: bool) -> tuple[str | None, bool]:
        """The class whose best candidate is claimed next: the best that fits what is
        free, less what a long-waiting better job keeps back. (class, any candidates).
        `ahead`: the best candidate, if it asks for the default resources."""
        tops = sorted((heap[0].sort, cid) for cid, heap in self._heaps.items() if heap)
        if not tops:
            return None, False
        if ahead:
            return (tops[0][1] if self._need(tops[0][1]).is_default else None), True
        slots = self.slots
        if slots is None:
            return tops[0][1], True
        reserved: Request | None = None
        for _, cid in tops:
            need = self._need(cid)
            if slots.fits(need, reserved):
                return cid, True
            if reserved is None and now - self._heaps[cid][0].since >= self.reserve_after:
                # the best job that does not fit has let others past long enough
                reserved = need
        self.reserving = reserved
        return None, True

    def take(self, n: int, budget: int, *, ahead: bool = False) -> list[Claimed]:
        """Claim up to n jobs that fit; scans at most a few budgets' worth of entries.

        `ahead`: for launching ahead (ahead.py), with nothing free: of the candidates in
        hand (no scan), the best while they ask for the default resources, claimed
        without a binding."""
        out: list[Claimed] = []
        now = self.ctx.clock()
        while self._later and self._later[0][0] <= now:
            _, seq, rank, h = heapq.heappop(self._later)
            self._push(_Candidate((-h.marker.priority, rank, seq), h, now))
        scans = 0
        self.reserving = None
        while len(out) < n:
            cid, _ = self._pick(now, ahead)
            if cid is None:
                # ahead, only candidates in hand: the claims for free workers scan
                if ahead or scans >= 2 or self.candidates >= CLASS_CAP:
                    break
                self.refill(budget)
                scans += 1
                continue
            c = heapq.heappop(self._heaps[cid])
            h = c.handle
            binding = None
            if self.slots is not None and not ahead:
                binding = self.slots.take(self._need(cid))
                if binding is None:
                    # its devices are held by an attempt that outlived its manager
                    self._push(c)
                    break
            self._queued.discard((h.key, h.marker.generation))
            got = self._claim(h, now, binding, c.sort)
            if got is not None:
                out.append(got)
            elif binding is not None and self.slots is not None:
                self.slots.give(binding)
        return out

    def best(self) -> Sort | None:
        """The place of the candidate in hand that a claim would take next (None: none)."""
        cid, _ = self._pick(self.ctx.clock(), False)
        return self._heaps[cid][0].sort if cid is not None else None

    def too_long_for_us(self, key: str) -> bool:
        """A job whose declared time does not fit before this manager's end: not ours."""
        return key in self._too_long

    def need_of(self, key: str) -> float | None:
        """The time a job too long for us declared (None: not known to be too long)."""
        seen = self._too_long.get(key)
        return seen[1] if seen is not None else None

    def unfit(self) -> tuple[int, float | None]:
        """How many ready jobs were too long for our end, and the longest time declared.

        A job still ready is looked at again every TOO_LONG_RECHECK seconds; one not
        looked at again for longer has moved on (claimed elsewhere, cancelled)."""
        stale = self.ctx.clock() - TOO_LONG_RECHECK
        for key in [k for k, (again, _) in self._too_long.items() if again < stale]:
            del self._too_long[key]
        if not self._too_long:
            return 0, None
        return len(self._too_long), max(need for _, need in self._too_long.values())

    def forget_unfit(self, keep: Collection[str]) -> None:
        """Keep only these keys among the jobs found too long (the others moved on)."""
        for key in [k for k in self._too_long if k not in keep]:
            del self._too_long[key]

    @property
    def backlog(self) -> int:
        """Candidates known but not yet claimable (in backoff)."""
        return len(self._later)

    def _claim(
        self, h: JobHandle, now: float, binding: Binding | None, sort: Sort
    ) -> Claimed | None:
        ctx = self.ctx
        if self.ends_at is not None and self._too_long.get(h.key, (0.0, 0.0))[0] > now:
            return None
        try:
            frame = ctx.ws.reader.frame(h.marker.ref)
            spec = ctx.specs.pop(h.key, None) or load_spec(ctx.ws, h.placement, h.key)
        except FileNotFoundError:
            return None  # claimed by someone else meanwhile, or gone
        except FlowError as e:
            try:
                fail(ctx.ws, h, None, "protocol_error", e.render(), actor=ctx.actor)
            except FlowError:
                ctx.report_once(h.key, e.render())
            return None
        # the request grows with the time limit after each attempt the limit stopped
        need = spec.time_request_after(frame.snap.timeouts)
        if self.ends_at is not None and need is not None and now + need > self.ends_at:
            if len(self._too_long) > 100_000:
                self._too_long.clear()
            self._too_long[h.key] = (now + TOO_LONG_RECHECK, need)
            return None
        self._too_long.pop(h.key, None)
        snap = frame.snap
        n = snap.tries + 1
        attempt = AttemptRecord(
            n=n,
            id=attempt_name(n),
            manager=ctx.actor,
            host=ctx.ws.host,
            step=snap.step or spec.step,
        )
        body = frame.body.carry(
            snap=snap.but(try_=snap.try_ + 1, tries=n), attempt=attempt, why="claimed"
        )
        try:
            claimed = transition(ctx.ws, h, State.CLAIMED, body, actor=ctx.actor, note="")
        except TransitionConflict:
            return None
        except FileNotFoundError:
            return None
        except FlowError as e:
            ctx.report_once(h.key, f"cannot claim: {e.render()}")
            if not is_transient(e):
                self.unclaimable.add(h.key)  # a full disk passes; a damaged job does not
            return None
        crash_point("claim.after_claim")
        return Claimed(claimed, spec, body, frame, binding, sort)

    def release(self, c: Claimed) -> None:
        """Give a claim back (drain started between claim and launch)."""
        body = c.body.released("released")
        try:
            transition(self.ctx.ws, c.handle, State.READY, body, actor=self.ctx.actor)
        except FlowError:
            pass
        if c.binding is not None and self.slots is not None:
            self.slots.give(c.binding)
