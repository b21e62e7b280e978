"""Counting a member's end into its dependency sets and moving the dependents of a decided
set (protocol.md §14). Every step is idempotent, so any process may do it, and do it
again after a crash: the renames decide who counted and who moved what.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections import defaultdict
from collections.abc import Iterable

from httk_flow.errors import FlowError, InvalidJob, TransitionConflict
from httk_flow.protocol import layout
from httk_flow.protocol.after import AfterPolicy, DependencySets, Verdict, verdict
from httk_flow.protocol.crash import crash_point
from httk_flow.protocol.discovery import markers_of_placement
from httk_flow.protocol.fsio import fs, write_file
from httk_flow.protocol.handles import JobHandle
from httk_flow.protocol.jobs import current_frame, fail, load_spec, register
from httk_flow.protocol.names import Marker
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import install_dependency_hook, transition
from httk_flow.protocol.workspace import Workspace

_TERMINAL = (State.SUCCEEDED, State.FAILED, State.CANCELLED)
#: where a dependent can be while its sets are open, in the order a release lists them:
#: waiting again last, so a dependent a resume moves paused -> waiting while the listings
#: run is seen in one of them
_DEPENDENT_STATES = (State.SUBMITTED, State.WAITING, State.PAUSED, State.WAITING)


def member_ended(ws: Workspace, job: JobHandle, *, actor: str) -> None:
    """`job` just moved to a terminal state: count it in every set that waits for it and
    release the dependents of each set that this decides. Called by every transition;
    a job no set waits for costs one failed lookup. Dependents that end in turn (a
    cancelled chain) are handled by the same loop, not by recursion."""
    if ws.ends_queue is not None:
        ws.ends_queue.append((job.key, job.state))
        return
    crash_point("after.before_count")
    queue = ws.ends_queue = [(job.key, job.state)]
    try:
        while queue:
            key, state = queue.pop()
            for set_id in count_end(ws, key, state):
                release_set(ws, set_id, actor=actor)
    finally:
        ws.ends_queue = None


def count_end(ws: Workspace, key: str, state: State) -> list[str]:
    """Count one end in the sets watching `key`; returns the sets this end decided."""
    d = layout.watch_member(ws.root, key)
    try:
        entries = [e.name for e in fs.scandir(d)]
    except OSError:
        return []
    sets = DependencySets(ws)
    decided = []
    kept = False
    for name in entries:
        set_id, _, pol = name.partition(".")
        try:
            policy = AfterPolicy(pol)
        except ValueError:
            continue
        if not policy.counts(state):
            kept = True  # a failed job may be resumed: it still counts later
            continue
        sd = sets.set_dir(set_id)
        pending = os.path.join(sd, "pending", key)
        # `broken` before the count: whoever empties pending/ next must see it, or it
        # would release the dependents as if every member had succeeded
        if policy.breaks(state) and fs.exists(pending):
            try:
                write_file(
                    os.path.join(sd, "broken"),
                    f"{key} {state.value}".encode(),
                    durable=ws.policy.durable,
                )
                decided.append(set_id)
            except (FileExistsError, FileNotFoundError):
                pass  # broken already, or no such set
        try:
            fs.rename(pending, os.path.join(sd, "ended", f"{key}.{state.value}"))
        except FileNotFoundError:
            pass  # counted already (a crash after the count), or the set is gone
        crash_point("after.after_count")
        try:
            os.rmdir(os.path.join(sd, "pending"))
            decided.append(set_id)  # the last member: this end completed the set
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                raise
        crash_point("after.after_decide")
        try:
            os.unlink(os.path.join(d, name))
        except FileNotFoundError:
            pass
    if not kept:
        try:
            os.rmdir(d)
        except OSError:
            pass  # a set made meanwhile watches it again
    return list(dict.fromkeys(decided))


def release_set(ws: Workspace, set_id: str, *, actor: str) -> int:
    """Move every dependent of a decided set where its sets now send it; returns how
    many moved. Repeated after a crash by any manager's sweep: dependents that moved
    on already are skipped."""
    sets = DependencySets(ws)
    st = sets.status(set_id)
    if not st.exists or (not st.complete and st.broken is None):
        return 0
    what = "complete" if st.complete else "broken"
    by_placement: dict[str, set[str]] = defaultdict(set)
    for key, placement in sets.dependents(set_id):
        by_placement[placement].add(key)
    moved = 0
    settled = True
    for placement, keys in by_placement.items():
        for h in _of_keys(ws, placement, keys, _DEPENDENT_STATES):
            new, ok = settle_with_retry(ws, h, actor=actor)
            moved += new is not None
            settled = settled and ok
    crash_point("after.before_released")
    if settled:
        sets.mark_released(set_id, what)  # else the sweep releases it again
    return moved


def settle_with_retry(ws: Workspace, h: JobHandle, *, actor: str) -> tuple[JobHandle | None, bool]:
    """settle, looking for the job again when something moved it first (a resume, a
    registrant, another releaser). Returns where it went (None: it stays) and whether
    it was settled; False: an error that may pass (a full disk) left it for a sweep."""
    for _ in range(5):
        try:
            return settle(ws, h, actor=actor), True
        except TransitionConflict:
            again = _locate(ws, h.placement, h.key)
            if again is None:
                return None, True
            h = again
        except InvalidJob as e:
            # its definition cannot be read: it could never be released, so it fails
            with contextlib.suppress(FlowError):
                return fail(ws, h, None, "protocol_error", e.render(), actor=actor), True
            return None, False
        except (FlowError, OSError):
            return None, False
    return None, False


def settle(
    ws: Workspace, h: JobHandle, *, actor: str, v: Verdict | None = None
) -> JobHandle | None:
    """Move one dependent as its sets say; None when it stays where it is.

    Submitted: registered (registration decides from the sets). Waiting: to ready, or
    cancelled or failed. Paused: stays paused, its `.a` dropped once the sets are met
    (a resume then makes it ready), or cancelled or failed."""
    if h.state is State.SUBMITTED:
        new = register(ws, h, actor=actor)
        return new if new.state is not State.WAITING else None
    if not h.marker.after or h.state not in (State.WAITING, State.PAUSED):
        return None
    if v is None:
        v = verdict(ws, load_spec(ws, h.placement, h.key).after)
    if v.kind == "wait":
        return None
    frame = current_frame(ws, h)
    if v.kind == "cancel":
        body = frame.body.carry(why="dependency not met", reason=v.reason)
        return transition(ws, h, State.CANCELLED, body, actor=actor)
    if v.kind == "fail":
        return fail(ws, h, frame, "dependency_failure", v.reason, actor=actor)
    if h.state is State.PAUSED:
        body = frame.body.carry(why=v.reason, join=frame.body.join)
        return transition(ws, h, State.PAUSED, body, actor=actor, after=False)
    return transition(ws, h, State.READY, frame.body.carry(why=v.reason), actor=actor, after=False)


def resume_target(ws: Workspace, h: JobHandle) -> tuple[State, Verdict] | None:
    """Where a resume sends a paused job with unmet dependencies (None: no `.a`): ready
    once its sets are met, waiting while they are open (the caller settles it again
    after that rename), cancelled or failed as they decided."""
    if not h.marker.after:
        return None
    v = verdict(ws, load_spec(ws, h.placement, h.key).after)
    target = {
        "ready": State.READY,
        "wait": State.WAITING,
        "cancel": State.CANCELLED,
        "fail": State.FAILED,
    }[v.kind]
    return target, v


def _of_keys(
    ws: Workspace, placement: str, keys: set[str], states: Iterable[State]
) -> list[JobHandle]:
    """The markers of `keys` in one placement: by their hints when there are few, else one
    listing per state kind."""
    out: dict[str, JobHandle] = {}
    if len(keys) <= HINTED:
        for key in keys:
            h = _hinted(ws, placement, key, states)
            if h is not None:
                out[key] = h
        keys = keys - out.keys()
        if not keys:
            return list(out.values())
    for st, m in markers_of_placement(ws, placement, states, keys=keys):
        out.setdefault(m.key, JobHandle(st, placement, m))
    return list(out.values())


#: up to this many dependents in one placement are looked up by their hints, not listed
HINTED = 8


def note_marker(ws: Workspace, h: JobHandle) -> None:
    """Leave `<state> <marker name>` of a dependent with unmet dependencies in its job
    directory: its releaser then finds it with one read and one lstat, not a listing of
    every job waiting beside it. Only a hint: a stale or missing one means a listing."""
    hint = layout.after_hint(ws.job_dir(h.placement, h.key))
    tmp = f"{hint}.{os.urandom(4).hex()}"
    try:
        write_file(tmp, f"{h.state.value} {h.marker.name}".encode(), durable=False)
        os.replace(tmp, hint)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def forget_marker(ws: Workspace, h: JobHandle) -> None:
    with contextlib.suppress(OSError):
        os.unlink(layout.after_hint(ws.job_dir(h.placement, h.key)))


def _hinted(ws: Workspace, placement: str, key: str, states: Iterable[State]) -> JobHandle | None:
    try:
        raw = fs.read_bytes(layout.after_hint(ws.job_dir(placement, key)), 1024).decode()
        kind, _, name = raw.partition(" ")
        st = State(kind)
    except (OSError, ValueError):
        return None
    m = Marker.parse_or_none(name)
    if st not in states or m is None or m.key != key:
        return None
    try:
        os.lstat(ws.marker_path(st, placement, m))
    except OSError:
        return None
    return JobHandle(st, placement, m)


def _locate(ws: Workspace, placement: str, key: str) -> JobHandle | None:
    for s, m in markers_of_placement(ws, placement, key=key):
        return JobHandle(s, placement, m)
    return None


def sweep_sets(ws: Workspace, *, actor: str) -> int:
    """Release every decided set whose release did not finish (its releaser died)."""
    sets = DependencySets(ws)
    moved = 0
    for set_id in sets.all_sets():
        st = sets.status(set_id)
        if not st.exists:
            continue
        done = sets.released(set_id)
        if (st.complete and done != "complete") or (st.broken is not None and done is None):
            moved += release_set(ws, set_id, actor=actor)
    return moved


def sweep_ends(ws: Workspace, *, actor: str) -> int:
    """Count ends whose counting was cut short (the process that ended the job died
    between its rename and the count): one listing per state kind of each placement
    that holds a watched job, not a walk of the workspace."""
    root = layout.watch_dir(ws.root)
    try:
        keys = [e.name for e in fs.scandir(root)]
    except OSError:
        return 0
    by_placement: dict[str, set[str]] = defaultdict(set)
    for key in keys:
        placement = _watched_placement(os.path.join(root, key))
        if placement is not None:
            by_placement[placement].add(key)
    n = 0
    for placement, wanted in by_placement.items():
        for h in _of_keys(ws, placement, wanted, _TERMINAL):
            for set_id in count_end(ws, h.key, h.state):
                release_set(ws, set_id, actor=actor)
            n += 1
    return n


def _watched_placement(d: str) -> str | None:
    try:
        for e in fs.scandir(d):
            return fs.read_bytes(os.path.join(d, e.name), 4096).decode()
    except OSError:
        return None
    return None


def make_set(
    ws: Workspace,
    selector: str,
    policy: AfterPolicy,
    members: Iterable[JobHandle],
    *,
    actor: str,
    set_id: str | None = None,
) -> str:
    """Publish a dependency set, watch its pending members, and count those that ended
    while it was being made (their end could not find the watch entry yet)."""
    sets = DependencySets(ws)
    set_id, pending = sets.create(selector, policy, members, actor=actor, set_id=set_id)
    if not pending:
        return set_id
    sets.watch(set_id, policy, pending)
    crash_point("after.after_watch")
    by_placement: dict[str, set[str]] = defaultdict(set)
    for h in pending:
        by_placement[h.placement].add(h.key)
    for placement, keys in by_placement.items():
        for h in _of_keys(ws, placement, keys, _TERMINAL):
            for decided in count_end(ws, h.key, h.state):
                release_set(ws, decided, actor=actor)
    return set_id


def _moved(ws: Workspace, old: JobHandle, new: JobHandle, actor: str) -> None:
    """After every move of a dependent or into a terminal state (transition's hook)."""
    if new.marker.after:
        note_marker(ws, new)  # where its releaser finds it
    elif old.marker.after:
        forget_marker(ws, new)
    if new.state.is_terminal and new.state is not old.state:
        # counted by the sets that wait for it; the move itself has happened, so an error
        # here (a full disk) is not its caller's: the watch entry stays and a sweep counts it
        with contextlib.suppress(OSError, FlowError):
            member_ended(ws, new, actor=actor)


install_dependency_hook(_moved)
