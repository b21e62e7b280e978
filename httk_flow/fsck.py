"""`flow fsck`: markers, payloads and journal checked against each other.

Repairs only what is provably safe (stale temporaries, entries that are not markers,
orphaned payloads and superseded duplicate markers are moved to .flow/lost+found) and
reports the rest. Runs under a host-local exclusive lock; claim correctness never
depends on it.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from filelock import FileLock, Timeout

from httk_flow import names
from httk_flow.discovery import MarkerStream
from httk_flow.errors import FlowError, UsageError
from httk_flow.jobs import load_spec
from httk_flow.journal import iter_segment
from httk_flow.states import State
from httk_flow.transition import JobHandle, locate_key
from httk_flow.workspace import FLOW_DIR, Workspace

#: a temporary or unreferenced payload younger than this may belong to a live operation
GRACE = 3600.0
#: directories inside a job that never hold child jobs
_JOB_INTERNALS = frozenset({"attempts", "run", "files"})


@dataclass
class Problem:
    kind: str
    obj: str
    message: str
    repaired: bool = False

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

    @property
    def clean(self) -> bool:
        return not [p for p in self.problems if not p.repaired]


class Fsck:
    def __init__(self, ws: Workspace, *, repair: bool, now: float | None = None) -> None:
        self.ws = ws
        self.repair = repair
        self.now = time.time() if now is None else now
        self.report = FsckReport()
        self.lost = os.path.join(ws.flow, "lost+found")

    def run(self) -> FsckReport:
        lock = FileLock(os.path.join(self.ws.flow, "fsck.lock"))
        try:
            with lock.acquire(timeout=0):
                self._markers()
                self._payloads()
                self._tmp()
                self._journal()
        except Timeout:
            raise UsageError(
                "another fsck or gc is running on this host",
                obj="flow fsck",
                hint="wait for it to finish",
            ) from None
        return self.report

    def _problem(self, kind: str, obj: str, message: str, fix: str | None = None) -> None:
        repaired = False
        if self.repair and fix is not None:
            repaired = self._quarantine(fix)
        self.report.problems.append(Problem(kind, obj, message, repaired))

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
        for st in State:
            stream = MarkerStream(self.ws, st, on_bad=self._bad_entry)
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

    def _bad_entry(self, path: str, why: str) -> None:
        # a directory we cannot list may hold live markers: report it, never move it
        is_dir = os.path.isdir(path) and not os.path.islink(path)
        self._problem("bad_entry", path, why, fix=None if is_dir else path)

    def _marker(self, h: JobHandle) -> None:
        try:
            frame = self.ws.reader.read(h.marker.ref)
            if frame.get("key") != h.key or frame.get("to") != h.state.value:
                self._problem(
                    "frame_mismatch",
                    f"job {h.key}",
                    f"its marker in {h.state.value} names a frame for "
                    f"{frame.get('key')} -> {frame.get('to')}",
                )
        except FlowError as e:
            self._problem("unreadable_frame", f"job {h.key}", e.render())
        try:
            load_spec(self.ws, h.placement, h.key)
        except FlowError as e:
            self._problem("bad_payload", f"job {h.key}", e.render())

    # -- payloads ------------------------------------------------------------------

    def _payloads(self) -> None:
        for path, _placement, key in self._job_dirs(self.ws.root, ""):
            self.report.payloads += 1
            if key in self.keys:
                continue
            age = self.now - _mtime(path)
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

    def _job_dirs(self, d: str, placement: str) -> Iterator[tuple[str, str, str]]:
        try:
            entries = list(os.scandir(d))
        except OSError:
            return
        for e in entries:
            if not e.is_dir(follow_symlinks=False) or e.name.startswith("."):
                continue
            if names.KEY_RE.fullmatch(e.name) and os.path.exists(os.path.join(e.path, "job.json")):
                yield e.path, placement, e.name
                # children live inside their parent
                yield from self._job_dirs(e.path, f"{placement}/{e.name}" if placement else e.name)
            elif e.name not in _JOB_INTERNALS and d != os.path.join(self.ws.root, FLOW_DIR):
                yield from self._job_dirs(e.path, f"{placement}/{e.name}" if placement else e.name)

    # -- temporaries and journal --------------------------------------------------------

    def _tmp(self) -> None:
        try:
            entries = list(os.scandir(self.ws.tmp))
        except OSError:
            return
        for e in entries:
            if self.now - _mtime(e.path) < GRACE:
                continue
            self.report.problems.append(
                Problem(
                    "stale_tmp",
                    e.path,
                    "left by an interrupted operation",
                    repaired=self.repair and _remove(e.path),
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
                    self._problem(
                        "unreadable_frame",
                        seg.path,
                        f"{len(bad)} frame(s) do not parse (first at byte {bad[0]})",
                    )


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
