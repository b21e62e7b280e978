"""`flow fsck`: markers, payloads and journal checked against each other.

Repairs only what is provably safe (stale temporaries, entries that are not markers,
orphaned payloads and superseded duplicate markers are moved to .flow/lost+found) and
reports the rest. Runs under a host-local exclusive lock; claim correctness never
depends on it. Where the lock cannot be created (a read-only or full filesystem, another
user's workspace) it checks read-only and repairs nothing.
"""

from __future__ import annotations

import datetime as dt
import errno
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field

from filelock import FileLock, Timeout

from httk_flow.errors import FlowError, UsageError
from httk_flow.protocol import layout, leases, names, staging
from httk_flow.protocol.discovery import MarkerStream
from httk_flow.protocol.frames import Frame
from httk_flow.protocol.fsio import fsync_dir
from httk_flow.protocol.jobs import find_attempt_dir, load_spec
from httk_flow.protocol.journal import iter_segment
from httk_flow.protocol.leases import Liveness
from httk_flow.protocol.logstream import read_record
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import move_birth
from httk_flow.protocol.transition import JobHandle, locate_key, put_back
from httk_flow.protocol.workspace import Workspace

#: a temporary or unreferenced payload younger than this may belong to a live operation
GRACE = staging.STAGING_GRACE
#: why the lock file cannot be created that mean "this workspace is not writable here":
#: then fsck checks read-only rather than not at all
_READ_ONLY_ERRNOS = frozenset({errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM})
#: a healthy manager holds a job in claimed or committing for seconds; past
#: max(STUCK_FLOOR, STUCK_LEASES x lease) the job is stuck
STUCK_FLOOR = 600.0
STUCK_LEASES = 20
_BRIEF = (State.CLAIMED, State.COMMITTING)


@dataclass
class Problem:
    kind: str
    obj: str
    message: str
    repaired: bool = False
    #: --repair would fix it (the others are for a person, or a manager, to look at)
    fixable: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "object": self.obj,
            "message": self.message,
            "repaired": self.repaired,
        }


@dataclass
class FsckReport:
    markers: int = 0
    payloads: int = 0
    segments: int = 0
    problems: list[Problem] = field(default_factory=list)
    #: why fsck ran without its lock and so without repairs; None when it held the lock
    read_only: str | None = None
    lock: str = ""

    @property
    def clean(self) -> bool:
        return not [p for p in self.problems if not p.repaired]

    @property
    def fixable(self) -> bool:
        """Some problem left that --repair would fix."""
        return any(p.fixable and not p.repaired for p in self.problems)


class Fsck:
    def __init__(self, ws: Workspace, *, repair: bool, now: float | None = None) -> None:
        self.ws = ws
        self.repair = repair
        # the filesystem's clock: the ages compared below are of its own stamps
        self.now = leases.fs_now(ws) if now is None else now
        self.report = FsckReport()
        self.lost = layout.lost_found(ws.root)
        self._live: dict[str, Liveness] | None = None

    def run(self) -> FsckReport:
        path = layout.fsck_lock(self.ws.root)
        self.report.lock = path
        try:
            held = FileLock(path).acquire(timeout=0)
        except Timeout:
            raise UsageError(
                "another fsck or gc is running on this host",
                obj="flow fsck",
                hint="wait for it to finish",
            ) from None
        except OSError as e:
            if e.errno not in _READ_ONLY_ERRNOS:
                raise
            if self.repair:
                raise FlowError(
                    f"cannot be created ({e.strerror}), so flow fsck cannot repair here",
                    obj=path,
                    hint="run `flow fsck` without --repair to check read-only, "
                    "or make the workspace writable first",
                ) from e
            self.report.read_only = e.strerror or str(e)
            self._check()
            return self.report
        with held:
            self._check()
        return self.report

    def _check(self) -> None:
        self._markers()
        self._payloads()
        self._tmp()
        self._journal()

    def _problem(self, kind: str, obj: str, message: str, fix: str | None = None) -> None:
        repaired = False
        if self.repair and fix is not None:
            repaired = self._quarantine(fix)
        self.report.problems.append(Problem(kind, obj, message, repaired, fix is not None))

    def _quarantine(self, path: str) -> bool:
        rel = os.path.relpath(path, self.ws.root).replace("/", "%")
        dest = os.path.join(self.lost, f"{rel}.{int(self.now)}")
        try:
            os.makedirs(self.lost, exist_ok=True)
            os.rename(path, dest)
            return True
        except OSError:
            return False

    # -- markers -------------------------------------------------------------------

    def _markers(self) -> None:
        self.keys: dict[str, list[JobHandle]] = {}
        #: markers outside the directory their state and class place them in, by key
        self.astray: dict[str, list[tuple[str, JobHandle]]] = {}
        for st in State:
            stream = MarkerStream(self.ws, st, on_bad=self._bad_entry, on_misplaced=self._astray)
            while stream.cycles < 1:
                for h in stream.next_batch(4096):
                    self.report.markers += 1
                    self.keys.setdefault(h.key, []).append(h)
                    self._marker(h)
            stream.close()
        for key, hs in self.keys.items():
            if len(hs) > 1:
                hs.sort(key=lambda h: h.marker.generation)
                for old in hs[:-1]:
                    if not os.path.lexists(old.path(self.ws)):
                        continue  # the job moved during the walk: seen twice, not duplicated
                    self._problem(
                        "duplicate_marker",
                        f"job {key}",
                        f"has {len(hs)} markers; generation "
                        f"{old.marker.generation} ({old.state.value}) is superseded "
                        f"by {hs[-1].marker.generation} ({hs[-1].state.value})",
                        fix=old.path(self.ws),
                    )
        for key, astray in self.astray.items():
            self._misplaced(key, astray)

    def _astray(self, path: str, h: JobHandle) -> None:
        """A marker outside the directory its state and class place it in (a class
        directory, protocol.md §1): no transition can move it, since each renames a marker
        from there. Judged once every marker of its job is known (_misplaced)."""
        self.report.markers += 1
        self.astray.setdefault(h.key, []).append((path, h))

    def _misplaced(self, key: str, astray: list[tuple[str, JobHandle]]) -> None:
        """The misplaced markers of one job. The newest is the job's marker if no marker
        in place is as new: --repair moves it there (no actor else can move it, nor make
        another of its job meanwhile). Every other is a stale copy, set aside by --repair."""
        placed = self.keys.setdefault(key, [])  # its payload is no orphan either way
        astray.sort(key=lambda pair: pair[1].marker.generation)
        newest = max((h.marker.generation for h in placed), default=-1)
        *stale, (path, h) = astray
        for p, old in stale:
            self._misplaced_copy(p, old, max(newest, h.marker.generation))
        where = h.path(self.ws)
        if newest >= h.marker.generation or os.path.lexists(where):
            self._misplaced_copy(path, h, max(newest, h.marker.generation))
            return
        message = f"its marker {path} lies outside {os.path.dirname(where)}"
        if placed:
            # a marker in place, of an older generation: which is the job's is for a person
            self._problem(
                "misplaced_marker",
                f"job {key}",
                f"{message}, and a marker of an older generation "
                f"({placed[-1].marker.generation}, {placed[-1].state.value}) is in place",
            )
            return
        repaired = False
        if self.repair:
            try:
                put_back(self.ws, path, h)
                repaired = True
            except (OSError, FlowError) as e:
                message = f"{message}; moving it failed: {e}"
        self.report.problems.append(
            Problem("misplaced_marker", f"job {key}", message, repaired, True)
        )
        if repaired:
            placed.append(h)
            self._marker(h)

    def _misplaced_copy(self, path: str, h: JobHandle, newest: int) -> None:
        self._problem(
            "misplaced_marker",
            f"job {h.key}",
            f"its marker {path} (generation {h.marker.generation}) lies outside the "
            f"directory its class places it in, and is superseded by generation {newest}",
            fix=path,
        )

    def _bad_entry(self, path: str, why: str) -> None:
        # a directory we cannot list may hold live markers: report it, never move it
        is_dir = os.path.isdir(path) and not os.path.islink(path)
        self._problem("bad_entry", path, why, fix=None if is_dir else path)

    def _marker(self, h: JobHandle) -> None:
        try:
            frame = self.ws.reader.frame(h.marker.ref)
            if frame.key != h.key or frame.to is not h.state:
                self._problem(
                    "frame_mismatch",
                    f"job {h.key}",
                    f"its marker in {h.state.value} names a frame for "
                    f"{frame.key} -> {frame.to.value}",
                )
            elif h.state.is_active:
                self._active(h, frame)
            elif frame.body.logs:
                self._streamed(h, frame)
        except FlowError as e:
            self._problem("unreadable_frame", f"job {h.key}", e.render())
        try:
            load_spec(self.ws, h.placement, h.key)
        except FlowError as e:
            self._problem("bad_payload", f"job {h.key}", e.render())

    def _streamed(self, h: JobHandle, frame: Frame) -> None:
        """The log records a final frame names (policy `logs: stream`) are whole and are
        that attempt's, unless its files are still there (a reader takes them first)."""
        n = frame.body.attempt.n if frame.body.attempt is not None else 0
        job_dir = self.ws.job_dir(h.placement, h.key)
        adir = find_attempt_dir(job_dir, n)
        for stream, ref in frame.body.logs or ():
            if os.path.exists(os.path.join(adir, stream)) or os.path.exists(
                layout.kept_output(job_dir, n, stream)
            ):
                continue
            if read_record(self.ws.root, ref, frame.job, n, stream) is None:
                self._problem(
                    "lost_output",
                    f"attempt {layout.attempt_name(n)} of job {h.key}",
                    f"its {stream} went to log record {ref}, which is gone or damaged: "
                    "`flow logs` cannot give it back",
                )

    # -- active jobs ---------------------------------------------------------------

    def _managers(self) -> dict[str, Liveness]:
        if self._live is None:
            self._live = {lv.info.id: lv for lv in leases.read_managers(self.ws, now=self.now)}
        return self._live

    def _active(self, h: JobHandle, frame: Frame) -> None:
        """An active job whose owner's lease ended, or that stays claimed or committing
        past the bound: reported (the next manager's recovery pass is the repair)."""
        try:
            # a rename sets the marker's ctime: when the job entered its state, fs clock
            since = os.lstat(h.path(self.ws)).st_ctime
        except OSError:
            return  # it moved on while we looked
        att = frame.body.attempt
        owner = att.manager or None if att is not None else None
        host = att.host if att is not None else None
        if h.state is State.COMMITTING and frame.by:
            # a commit is held by whoever wrote its committing frame (protocol.md §10)
            owner, host = frame.by, None
        lv = self._managers().get(owner) if owner is not None else None
        if lv is not None:
            host = lv.info.host
        on = f" on {host}" if host else ""
        where = f"{h.state.value}, held by"
        stamp = dt.datetime.fromtimestamp(since).strftime("%Y-%m-%d %H:%M:%S")
        age = _span(self.now - since)
        if owner is None:
            who = "no manager (its frame names none)"
        elif lv is None:
            grace = self.ws.policy.lease * self.ws.policy.takeover_factor
            if self.now - since <= grace:
                return  # a heartbeat may show up late on a shared filesystem
            who = f"manager {owner}{on}, which has no heartbeat,"
        elif not lv.alive:
            who = f"dead manager {owner}{on}"
        else:
            bound = max(STUCK_FLOOR, STUCK_LEASES * self.ws.policy.lease)
            if h.state in _BRIEF and self.now - since > bound:
                self._problem(
                    "stuck_job",
                    f"job {h.key}",
                    f"{h.state.value} for {age} (since {stamp}), past the {_span(bound)} "
                    f"bound, by live manager {owner}{on}; it may be hung: look at "
                    "its log, or stop it and the next manager recovers the job",
                )
            return
        self._problem(
            "dead_owner",
            f"job {h.key}",
            f"{where} {who} since {stamp} ({age} ago); the next manager recovers it",
        )

    # -- payloads ------------------------------------------------------------------

    def _payloads(self) -> None:
        for path, _placement, key in self._job_dirs(self.ws.root, ""):
            self.report.payloads += 1
            if key in self.keys:
                continue
            age = self.now - _mtime(path)
            born = _birth_marker(path)
            if born is not None and (age >= GRACE or self.repair):
                self._unborn(path, _placement, key, born, age)
                continue
            if age < GRACE:
                continue  # perhaps a submission or a commit in progress
            if locate_key(self.ws, _placement, key) is not None:
                continue  # it moved to a state already walked while we walked
            self._problem(
                "orphan_payload",
                path,
                f"a job directory without a marker ({age / 3600:.1f} h old)",
                fix=path,
            )

    def _unborn(self, path: str, placement: str, key: str, born: str, age: float) -> None:
        """A published payload whose birth marker was never moved out (protocol.md §6): a
        job, never litter. Completing it is one rename of that marker, which only one
        registrant can make, so --repair does it at any age, even beside a live one."""
        message = (
            f"its registration stopped before its marker {born} was moved out "
            f"({age / 3600:.1f} h old)"
        )
        if not self.repair:
            self.report.problems.append(
                Problem(
                    "orphan_payload",
                    path,
                    f"{message}; `flow fsck --repair` publishes the job",
                    fixable=True,
                )
            )
            return
        try:
            moved = move_birth(self.ws, placement, key, born)
        except OSError as e:
            self._problem("orphan_payload", path, f"{message}; publishing it failed: {e}")
            return
        if moved is None:
            return  # its own registrant moved it out meanwhile: nothing was wrong
        if self.ws.policy.durable:
            fsync_dir(moved)
        self.report.markers += 1
        self.report.problems.append(
            Problem("orphan_payload", path, f"{message}; published it", True, True)
        )

    def _job_dirs(self, d: str, placement: str) -> Iterator[tuple[str, str, str]]:
        try:
            entries = list(os.scandir(d))
        except OSError:
            return
        for e in entries:
            if not e.is_dir(follow_symlinks=False) or e.name.startswith("."):
                continue
            if names.KEY_RE.fullmatch(e.name) and os.path.exists(layout.job_file(e.path)):
                yield e.path, placement, e.name
                # children live inside their parent
                yield from self._job_dirs(e.path, f"{placement}/{e.name}" if placement else e.name)
            elif (
                e.name not in layout.JOB_INTERNALS
                and not layout.is_attempt_name(e.name)
                and d != layout.flow_dir(self.ws.root)
            ):
                yield from self._job_dirs(e.path, f"{placement}/{e.name}" if placement else e.name)

    # -- temporaries and journal --------------------------------------------------------

    def _tmp(self) -> None:
        try:
            entries = list(os.scandir(self.ws.tmp))
        except OSError:
            return
        for e in entries:
            # a staging directory whose submitter is gone on this host is no one's: at once
            if not staging.removable(e.name, self.now - _mtime(e.path)):
                continue
            self.report.problems.append(
                Problem(
                    "stale_tmp",
                    e.path,
                    "left by an interrupted operation",
                    repaired=self.repair and _remove(e.path),
                    fixable=True,
                )
            )

    def _journal(self) -> None:
        try:
            writers = list(os.scandir(self.ws.journal_dir))
        except OSError:
            return
        for w in writers:
            if not w.is_dir(follow_symlinks=False):
                self._problem("bad_entry", w.path, "is not a journal writer directory")
                continue
            for seg in os.scandir(w.path):
                self.report.segments += 1
                bad = [off for off, f in iter_segment(seg.path) if f is None]
                if bad:
                    # a damaged frame, or a line someone else appended (never referenced)
                    self._problem(
                        "unreadable_frame",
                        seg.path,
                        f"{len(bad)} line(s) are not readable frames (first at byte {bad[0]})",
                    )


def _birth_marker(job_dir: str) -> str | None:
    try:
        with os.scandir(job_dir) as it:
            return next((e.name for e in it if e.name.startswith(names.BIRTH_PREFIX)), None)
    except OSError:
        return None


def _span(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _mtime(path: str) -> float:
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return 0.0


def _remove(path: str) -> bool:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
        return True
    except OSError:
        return False
