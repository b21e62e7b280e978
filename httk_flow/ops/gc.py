"""`flow gc`: collect what the retention policy lets go.

Old attempt directories of finished jobs (the last attempt of each job is kept for
`flow logs`), journal segments that no marker's history reaches any more, the
directories of managers long stopped, and old retirement records of requests. Never a
persistent workdir, never a live attempt.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from dataclasses import dataclass, field

from filelock import FileLock, Timeout

from httk_flow.errors import FlowError, UsageError
from httk_flow.ops.lookup import view
from httk_flow.protocol import layout, logstream, requests
from httk_flow.protocol.after import DependencySets
from httk_flow.protocol.discovery import markers_of_placement, walk_all
from httk_flow.protocol.handles import JobHandle
from httk_flow.protocol.journal import iter_segment, segment_name
from httk_flow.protocol.leases import read_managers
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import locate_key
from httk_flow.protocol.workspace import Workspace

DAY = 86400.0
FINISHED = (State.SUCCEEDED, State.FAILED, State.CANCELLED)


@dataclass
class Collected:
    kind: str
    path: str
    bytes: int

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "path": self.path, "bytes": self.bytes}


@dataclass
class GcReport:
    dry_run: bool
    items: list[Collected] = field(default_factory=list)
    kept_segments: int = 0
    #: markers outside the directory their class places them in (`flow fsck --repair`
    #: puts them back): their jobs' histories are kept, their streamed output not judged
    misplaced: int = 0

    @property
    def bytes(self) -> int:
        return sum(i.bytes for i in self.items)


def _size(path: str) -> int:
    total = 0
    for root, dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
        del dirs
    return total


def collect(ws: Workspace, *, dry_run: bool, now: float | None = None) -> GcReport:
    now = time.time() if now is None else now
    report = GcReport(dry_run)
    lock = FileLock(layout.fsck_lock(ws.root))
    try:
        with lock.acquire(timeout=0):
            _attempts(ws, report, now)
            _segments(ws, report, now)
            if not report.misplaced:
                # a job whose marker is misplaced is found by no lookup: its output would
                # look like a gone job's
                _log_segments(ws, report, now)
            _managers(ws, report, now)
            _requests(ws, report, now)
            _dependency_sets(ws, report, now)
    except Timeout:
        raise UsageError(
            "another fsck or gc is running on this host",
            obj="flow gc",
            hint="wait for it to finish",
        ) from None
    return report


def _remove(report: GcReport, kind: str, path: str, *, is_dir: bool) -> None:
    size = _size(path) if is_dir else os.lstat(path).st_size
    report.items.append(Collected(kind, path, size))
    if report.dry_run:
        return
    if is_dir:
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _attempts(ws: Workspace, report: GcReport, now: float) -> None:
    horizon = now - ws.policy.keep_attempts_days * DAY
    for st in FINISHED:
        for h in walk_all(ws, st):
            try:
                ended = ws.reader.frame(h.marker.ref).t or now
            except FlowError:
                continue
            if ended > horizon:
                continue
            found = _attempt_files(ws.job_dir(h.placement, h.key))
            if not found:
                continue
            last = max(n for n, _, _ in found)
            for n, path, is_dir in sorted(found):
                if n < last:  # the last attempt stays for `flow logs`
                    _remove(report, "attempt", path, is_dir=is_dir)


def _attempt_files(job_dir: str) -> list[tuple[int, str, bool]]:
    """(number, path, is a directory) of what a job's attempts left: their directories
    (aNNNN/ beside job.json, or under attempts/ where revisions up to 5 made them) and the
    output that tidying moved up beside job.json (aNNNN.stdout)."""
    found = []
    adir = layout.attempts_dir(job_dir)
    try:
        # never through a link: what it points to is not the job's to collect
        legacy = [] if os.path.islink(adir) else list(os.scandir(adir))
    except OSError:
        legacy = []
    for e in legacy:
        if layout.is_attempt_name(e.name) and e.is_dir(follow_symlinks=False):
            found.append((layout.attempt_number(e.name), e.path, True))
    try:
        entries = list(os.scandir(job_dir))
    except OSError:
        return found
    for e in entries:
        name = e.name
        if layout.is_attempt_name(name):
            if e.is_dir(follow_symlinks=False):
                found.append((layout.attempt_number(name), e.path, True))
            continue
        stem, _, stream = name.partition(".")
        if layout.is_attempt_name(stem):
            n = layout.attempt_number(stem)
            # exactly the name tidying gives (a0001.stdout, never a1.stdout)
            kept = os.path.basename(layout.kept_output(job_dir, n, stream))
            if stream in ("stdout", "stderr") and name == kept:
                found.append((n, e.path, False))
    return found


def _segments(ws: Workspace, report: GcReport, now: float) -> None:
    """Delete old segments no job's history reaches (every marker's chain is walked)."""
    reachable: set[tuple[str, int]] = set()

    def reach(h: JobHandle) -> None:
        for ref in ws.reader.refs(h.marker.ref):
            reachable.add((ref.writer, ref.segment))

    for st in State:
        misplaced: list[JobHandle] = []  # their histories are kept all the same
        for h in walk_all(ws, st, misplaced=misplaced):
            reach(h)
        for h in misplaced:
            reach(h)
        report.misplaced += len(misplaced)
    horizon = now - ws.policy.keep_journal_days * DAY
    try:
        writers = list(os.scandir(ws.journal_dir))
    except OSError:
        return
    for w in writers:
        if not w.is_dir(follow_symlinks=False):
            continue
        segs = []
        for e in os.scandir(w.path):
            number = layout.segment_number(e.name)
            if number is not None:
                segs.append((number, e.path))
        for n, path in segs:
            if (w.name, n) in reachable or os.lstat(path).st_mtime > horizon:
                report.kept_segments += 1
                continue
            if _still_reached(ws, w.name, n, path):
                report.kept_segments += 1  # a job moved while we walked: it still needs it
                continue
            _remove(report, "journal_segment", path, is_dir=False)
        if (
            not report.dry_run
            and segs
            and not any(os.path.exists(os.path.join(w.path, segment_name(n))) for n, _ in segs)
        ):
            try:
                os.rmdir(w.path)
            except OSError:
                pass


def _log_segments(ws: Workspace, report: GcReport, now: float) -> None:
    """Delete log segments (policy `logs: stream`) not written to for as long as attempts
    are kept and holding only output gc would collect as files: of jobs that are gone, or
    of a finished job's attempts before its last (the last stays for `flow logs`)."""
    horizon = now - ws.policy.keep_attempts_days * DAY
    try:
        writers = list(os.scandir(logstream.logs_dir(ws.root)))
    except OSError:
        return
    last: dict[tuple[str, str], int | None] = {}  # job -> its last attempt (None: keep all)
    for w in writers:
        if not w.is_dir(follow_symlinks=False):
            continue
        for e in os.scandir(w.path):
            if logstream.segment_number(e.name) is None or e.stat().st_mtime > horizon:
                continue
            if all(_collectable(ws, h, last) for h in logstream.iter_headers(e.path)):
                _remove(report, "log_segment", e.path, is_dir=False)
        if not report.dry_run:
            try:
                os.rmdir(w.path)  # the writer's last segment went
            except OSError:
                pass


def _collectable(
    ws: Workspace, head: logstream.Header | None, last: dict[tuple[str, str], int | None]
) -> bool:
    if head is None:
        return True  # a torn tail: output no frame can name
    job = (head.placement, head.key)
    if job not in last:
        h = locate_key(ws, *job)
        if h is None:
            last[job] = 0  # gone
        elif h.state not in FINISHED:
            last[job] = None
        else:
            runs = view(ws, h).attempts
            last[job] = runs[-1].record.n if runs else None
    n = last[job]
    if n is None:
        return False
    return n == 0 or head.attempt < n


def _still_reached(ws: Workspace, writer: str, segment: int, path: str) -> bool:
    """Look again at every job with a frame in this segment, from its current marker."""
    jobs = {
        (f["placement"], f["key"])
        for _, f in iter_segment(path)
        if f is not None and isinstance(f.get("placement"), str) and isinstance(f.get("key"), str)
    }
    for placement, key in jobs:
        h = locate_key(ws, placement, key)
        if h is not None and any(
            (ref.writer, ref.segment) == (writer, segment) for ref in ws.reader.refs(h.marker.ref)
        ):
            return True
    return False


def _managers(ws: Workspace, report: GcReport, now: float) -> None:
    horizon = ws.policy.keep_journal_days * DAY
    for lv in read_managers(ws):
        if not lv.alive and lv.age > horizon:
            _remove(report, "manager", layout.manager_dir(ws.root, lv.info.id), is_dir=True)


def _requests(ws: Workspace, report: GcReport, now: float) -> None:
    """Retirement records of requests, kept as long as the journal (`flow requests`)."""
    horizon = now - ws.policy.keep_journal_days * DAY
    try:
        entries = list(os.scandir(requests.done_dir(ws)))
    except OSError:
        return
    for e in entries:
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_mtime < horizon:
            _remove(report, "request_record", e.path, is_dir=False)


def _dependency_sets(ws: Workspace, report: GcReport, now: float) -> None:
    """Dependency sets whose every member ended and whose dependents were all moved on
    (`released` says complete), once their last change is as old as the journal kept."""
    horizon = now - ws.policy.keep_journal_days * DAY
    sets = DependencySets(ws)
    for set_id in sets.all_sets():
        if sets.released(set_id) != "complete":
            continue
        path = sets.set_dir(set_id)
        try:
            changed = os.stat(os.path.join(path, "released")).st_mtime
        except OSError:
            continue
        if changed < horizon and not _still_needed(ws, sets, set_id):
            _remove(report, "dependency_set", path, is_dir=True)


def _still_needed(ws: Workspace, sets: DependencySets, set_id: str) -> bool:
    """A dependent that still decides from its sets (submitted, or `.a`), or that has no
    marker yet (its birth to be completed), may read this set again: keep it."""
    by_placement: dict[str, set[str]] = {}
    for key, placement in sets.dependents(set_id):
        by_placement.setdefault(placement, set()).add(key)
    for placement, keys in by_placement.items():
        seen = set()
        for st, m in markers_of_placement(ws, placement, keys=keys):
            if m.key in keys:
                seen.add(m.key)
                if st is State.SUBMITTED or m.after:
                    return True
        if seen != keys:
            return True
    return False
