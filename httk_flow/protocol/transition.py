"""The verified transition: one rename of the exact current marker, checked and resolved.

Renaming the current marker is the compare-and-swap of the protocol. A journal frame
describing the move is appended first; the new marker names it. After any rename error
the actor looks at what really happened and never guesses.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from httk_flow.errors import FlowError, InvalidName, TransitionConflict
from httk_flow.protocol.crash import crash_point
from httk_flow.protocol.discovery import markers_of_placement
from httk_flow.protocol.frames import Body, Frame
from httk_flow.protocol.fsio import fs, fsync_dir, rename_recreating
from httk_flow.protocol.handles import JobHandle
from httk_flow.protocol.names import RecordRef, check_placement
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

__all__ = [
    "JobHandle",
    "Move",
    "TransitionObserver",
    "locate_key",
    "rename_marker",
    "transition",
    "transition_many",
]


class TransitionObserver(Protocol):
    """Told of every transition this process made through one Workspace object, after its
    rename succeeded: the handle before, the handle after, the frame written, and the
    caller's `note` (None when it gave none; never written into the frame)."""

    def __call__(self, old: JobHandle, new: JobHandle, frame: Frame, note: str | None) -> None:
        """Record the move; it has happened and cannot be undone here."""


def transition(
    ws: Workspace,
    job: JobHandle,
    target: State,
    body: Body,
    *,
    actor: str,
    priority: int | None = None,
    not_before: int = 0,
    note: str | None = None,
    after: bool | None = None,
) -> JobHandle:
    """Move `job` to `target`, recording `body` in the journal; returns the new handle.

    `after`: the new marker's `.a` (unmet dependencies); None keeps the old one's while
    the job stays out of a manager's hands (submitted, waiting, paused), else drops it.

    Once the rename succeeded, each of the workspace's `on_transition` observers is told
    (old handle, new handle, frame, `note`); `note` is for them only, not for the frame.
    Raises TransitionConflict when another actor moved the marker first.
    """
    job.state.check(target)
    frame = _frame(job, target, body, actor)
    ref = ws.writer.append(frame.to_json())
    if target is State.READY:
        ws.reader.remember(ref, frame)  # read back at the claim
    crash_point("transition.after_journal")
    new = _successor(job, target, ref, priority, not_before, after)
    rename_marker(ws, job, new)
    crash_point("transition.after_rename")
    _told(ws, job, new, frame, note, actor)
    return new


@dataclass(frozen=True)
class Move:
    """One job's part of transition_many: as transition()'s arguments."""

    job: JobHandle
    target: State
    body: Body


def transition_many(
    ws: Workspace, moves: Sequence[Move], *, actor: str
) -> list[JobHandle | FlowError]:
    """transition() for several jobs: their frames appended in one write (one fsync in
    durable mode), then each renamed (§4), the directories made durable once each.

    Per move, in order: the new handle, or the FlowError its rename raised (a lost race
    is a TransitionConflict); a frame whose rename failed is never named, so invisible.
    """
    for m in moves:
        m.job.state.check(m.target)
    frames = [_frame(m.job, m.target, m.body, actor) for m in moves]
    refs = ws.writer.append_many([f.to_json() for f in frames])
    for m, frame, ref in zip(moves, frames, refs, strict=True):
        if m.target is State.READY:
            ws.reader.remember(ref, frame)  # read back at the claim
    crash_point("transition.after_journal")
    out: list[JobHandle | FlowError] = []
    moved: list[tuple[JobHandle, JobHandle, Frame]] = []
    durable = ws.policy.durable
    dirs: dict[str, None] = {}  # the directories to fsync, once each (durable mode)
    for m, frame, ref in zip(moves, frames, refs, strict=True):
        new = _successor(m.job, m.target, ref, None, 0, None)
        try:
            rename_marker(ws, m.job, new, sync=False)
        except FlowError as e:
            out.append(e)
            continue
        crash_point("transition.after_rename")
        out.append(new)
        moved.append((m.job, new, frame))
        if durable:
            dirs[os.path.dirname(new.path(ws))] = None
            dirs[os.path.dirname(m.job.path(ws))] = None
    for d in dirs:
        _fsync_state_dir(d)
    for old, new, frame in moved:
        _told(ws, old, new, frame, None, actor)
    return out


def _frame(job: JobHandle, target: State, body: Body, actor: str) -> Frame:
    return Frame(
        job=job.job_id,
        key=job.key,
        placement=job.placement,
        source=job.state,
        to=target,
        gen=job.marker.generation + 1,
        prev=job.marker.ref,
        t=round(time.time(), 3),
        by=actor,
        body=body,
    )


def _successor(
    job: JobHandle,
    target: State,
    ref: RecordRef,
    priority: int | None,
    not_before: int,
    after: bool | None,
) -> JobHandle:
    if after is None:
        after = job.marker.after and target in _DEPENDENCY_STATES
    marker = job.marker.successor(ref, priority=priority, not_before=not_before, after=after)
    return JobHandle(target, job.placement, marker)


def _told(
    ws: Workspace, old: JobHandle, new: JobHandle, frame: Frame, note: str | None, actor: str
) -> None:
    """The observers and the dependency sets, once the move has happened."""
    if ws.on_transition:
        for observer in ws.on_transition:
            observer(old, new, frame, note)
    if _dependency_hook is not None and (
        new.marker.after or old.marker.after or new.state.is_terminal
    ):
        _dependency_hook(ws, old, new, actor)


#: what a move means to the dependency sets (§14): installed by protocol/release.py, which
#: the manager and ops import; it moves other jobs in turn, so transition cannot import it
DependencyHook = Callable[[Workspace, JobHandle, JobHandle, str], None]
_dependency_hook: DependencyHook | None = None


def install_dependency_hook(hook: DependencyHook) -> None:
    global _dependency_hook
    _dependency_hook = hook


#: where a job may be while it has dependencies not yet met
_DEPENDENCY_STATES = frozenset({State.SUBMITTED, State.WAITING, State.PAUSED})


def rename_marker(ws: Workspace, old: JobHandle, new: JobHandle, *, sync: bool = True) -> None:
    """Rename old -> new, making the target directory when missing, resolving any error.

    `sync=False`: the caller makes both directories durable itself (durable mode)."""
    try:
        _rename_into(ws, old.path(ws), new, sync)
    except OSError as e:
        _resolve(ws, old, new, e)


def put_back(ws: Workspace, src: str, where: JobHandle) -> None:
    """Rename a marker found at `src`, outside the directory its state and class place it
    in (§1), to there (`flow fsck --repair`; no actor else moves it), as a transition
    renames one. OSError: it stays where it was."""
    _rename_into(ws, src, where, True)


def _rename_into(ws: Workspace, src: str, new: JobHandle, sync: bool) -> None:
    """rename(src, new's path), its directory made first when missing (and again when
    retired meanwhile); in durable mode a directory made is durable in its parents, and
    with `sync` both directories are made durable after the rename."""
    dst = new.path(ws)
    dst_dir = os.path.dirname(dst)
    durable = ws.policy.durable

    def made(d: str, by_us: bool) -> None:
        # a directory someone else made just now is checked (one we made is plain, and the
        # rename follows at once), and in durable mode its entry and its parents' are made
        # durable (once per directory made, batch or not), whoever made it: its maker may
        # not have done so yet
        if not by_us:
            ws.check_state_dir(d, again=True)
        if durable:
            _fsync_made(ws, d)

    if not ws.check_state_dir(dst_dir):
        # the first job of this placement in this state, or a directory retired once
        # empty (§1): made before the rename, rather than after a rename that failed
        by_us = fs.makedirs(dst_dir)
        if by_us:
            ws.made_state_dir(dst_dir)
        made(dst_dir, by_us)
    # retired again before our rename: made again and the rename tried again
    rename_recreating(src, dst, made)
    if sync and durable:
        _fsync_state_dir(dst_dir)
        if os.path.dirname(src) != dst_dir:
            _fsync_state_dir(os.path.dirname(src))


def _fsync_made(ws: Workspace, path: str) -> None:
    """Durable mode: the entries of a state directory just made (a placement's, a class
    directory, §1), up to its state kind, so a power loss cannot take the directory, and
    the marker renamed into it, away with it."""
    parent = os.path.dirname(path)
    while len(parent) > len(ws.state_root) + 1 and parent.startswith(ws.state_root):
        _fsync_state_dir(parent)
        if os.path.dirname(parent) == ws.state_root:
            break  # the state kind's own entry was made by `flow init`
        parent = os.path.dirname(parent)


def _fsync_state_dir(path: str) -> None:
    try:
        fsync_dir(path)
    except FileNotFoundError:
        pass  # emptied meanwhile and retired: its removal is on disk in its parent


def _resolve(ws: Workspace, old: JobHandle, new: JobHandle, err: OSError) -> None:
    """Decide what a failed rename did: won, lost, or unknown (stop and report)."""
    if fs.exists(new.path(ws)):
        return  # the rename happened although it reported an error (NFS retransmit)
    if fs.exists(old.path(ws)):
        raise FlowError(
            f"cannot move marker ({err.strerror})",
            obj=old.path(ws),
            hint="check permissions and free space in the workspace",
        ) from err
    # the job may move across kinds while we list them one by one: look a few times
    other = None
    for pause in (0.0, 0.01, 0.05, 0.2):
        time.sleep(pause)
        other = locate_key(ws, old.placement, old.key)
        if other is not None:
            break
    if other is not None:
        raise TransitionConflict(
            f"lost the race: the job is now {other.state.value} generation "
            f"{other.marker.generation}",
            obj=f"job {old.key}",
        )
    if fs.caches_attributes(ws.state_root):
        # an NFS client may list the winner's new marker only once its cached listing
        # expires (up to a minute): the source is gone, so someone moved it; act on nothing
        raise TransitionConflict(
            "lost the race: the marker was moved, to a place this host does not list yet",
            obj=f"job {old.key}",
        )
    raise FlowError(
        "marker vanished during a transition and no other marker exists",
        obj=f"job {old.key}",
        hint="run `flow fsck` before continuing",
    )


def locate_key(ws: Workspace, placement: str, key: str) -> JobHandle | None:
    """The job's marker found by looking in every state kind of its placement."""
    try:
        # callers may hold a placement read from a frame or a request: never list a path
        # that no submission could have made (one that leads out of the state tree)
        check_placement(placement)
    except InvalidName:
        return None
    for st, m in markers_of_placement(ws, placement, key=key):
        return JobHandle(st, placement, m)
    return None
