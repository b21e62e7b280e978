"""Append-only journal segments, one writer per process, and frame lookup by reference.

A frame is one orjson object on one line. A marker names the frame of its latest
transition; each frame names the one before (`prev`), so a job's history is a
backward walk and no per-job state file exists.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from httk_flow.errors import CorruptRecord, FlowError
from httk_flow.fsio import fsync_dir
from httk_flow.names import RecordRef, to36

Frame = dict[str, Any]
#: a frame larger than this is not ours (or is damaged); refuse it rather than buffer it
MAX_FRAME = 4 * 1024 * 1024
_READ_CHUNK = 2048


def segment_name(n: int) -> str:
    return f"{n}.jsonl"


class JournalWriter:
    """This process's segments under .flow/journal/<writer-id>/."""

    def __init__(self, journal_dir: str, *, durable: bool, segment_bytes: int) -> None:
        self._root = journal_dir
        self._durable = durable
        self._segment_bytes = segment_bytes
        self._fd = -1
        self._segment = 0
        self._offset = 0
        self.writer_id = ""
        self._dir = ""

    def _open_writer(self) -> None:
        # a fresh id per process: two writers never share a file, so appends need no lock
        while True:
            wid = to36(secrets.randbits(50))
            d = os.path.join(self._root, wid)
            try:
                os.mkdir(d)
            except FileExistsError:
                continue
            self.writer_id, self._dir = wid, d
            if self._durable:
                fsync_dir(self._root)
            self._open_segment(0)
            return

    def _open_segment(self, n: int) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        path = os.path.join(self._dir, segment_name(n))
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self._segment, self._offset = n, os.fstat(self._fd).st_size
        if self._durable:
            fsync_dir(self._dir)

    def append(self, frame: Frame) -> RecordRef:
        return self.append_many((frame,))[0]

    def append_many(self, frames: Sequence[Frame]) -> list[RecordRef]:
        """Append frames in one write; returns their refs. Durable mode syncs before return."""
        if self._fd < 0:
            self._open_writer()
        elif self._offset >= self._segment_bytes:
            self._open_segment(self._segment + 1)
        refs = []
        chunks = []
        off = self._offset
        for f in frames:
            data = orjson.dumps(f) + b"\n"
            refs.append(RecordRef(self.writer_id, self._segment, off))
            chunks.append(data)
            off += len(data)
        self._write(b"".join(chunks))
        self._offset = off
        return refs

    def _write(self, data: bytes) -> None:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            if self._durable:
                os.fsync(self._fd)
        except OSError as e:
            # never leave half a frame for the next append to land behind
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._offset)
            what = "the disk is full" if e.errno == errno.ENOSPC else e.strerror
            raise FlowError(
                f"cannot append to the journal: {what}",
                obj=os.path.join(self._dir, segment_name(self._segment)),
                hint="free space in the workspace and start the command again",
            ) from e

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


#: members every reader relies on, and their types (checked when a frame is read)
_INT_MEMBERS = ("gen", "act", "try", "tries", "intr")
_STR_MEMBERS = ("job", "key", "placement", "to", "step")
_DICT_MEMBERS = ("attempt", "join", "result", "decision", "failure", "evidence")


def check_frame(frame: Frame) -> str | None:
    """The first member of a frame whose type is wrong, or None: parsed at the boundary."""
    for k in _INT_MEMBERS:
        v = frame.get(k)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            return f"member {k!r}"
    for k in _STR_MEMBERS:
        v = frame.get(k)
        if v is not None and not isinstance(v, str):
            return f"member {k!r}"
    for k in _DICT_MEMBERS:
        v = frame.get(k)
        if v is not None and not isinstance(v, dict):
            return f"member {k!r}"
    prev = frame.get("prev")
    if prev is not None and not isinstance(prev, str):
        return "member 'prev'"
    join = frame.get("join")
    if isinstance(join, dict):
        kids = join.get("children", [])
        if (
            not isinstance(kids, list)
            or not all(
                isinstance(c, list)
                and len(c) == 2
                and isinstance(c[0], str)
                and (c[1] is None or isinstance(c[1], str))
                for c in kids
            )
            or not isinstance(join.get("act", 0), int)
            or not isinstance(join.get("next", ""), str)
        ):
            return "join"
    return None


class JournalReader:
    """Reads frames by reference through a small cache of open segment handles."""

    def __init__(self, journal_dir: str, *, cache: int = 64) -> None:
        self._root = journal_dir
        self._fds: OrderedDict[tuple[str, int], int] = OrderedDict()
        self._cache = cache

    def _fd(self, writer: str, segment: int) -> int:
        k = (writer, segment)
        fd = self._fds.get(k)
        if fd is not None:
            self._fds.move_to_end(k)
            return fd
        path = os.path.join(self._root, writer, segment_name(segment))
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            raise CorruptRecord(
                f"journal segment is unreadable ({e.strerror})",
                obj=path,
                hint="run `flow fsck` to see which jobs it affects",
            ) from e
        self._fds[k] = fd
        if len(self._fds) > self._cache:
            _, old = self._fds.popitem(last=False)
            os.close(old)
        return fd

    def read(self, ref: RecordRef) -> Frame:
        fd = self._fd(ref.writer, ref.segment)
        buf = b""
        pos = ref.offset
        while True:
            try:
                chunk = os.pread(fd, _READ_CHUNK if not buf else len(buf), pos)
            except (OverflowError, OSError) as e:
                raise CorruptRecord(
                    f"journal frame cannot be read ({e})", obj=f"record {ref}"
                ) from None
            if not chunk:
                raise CorruptRecord("journal frame is torn or missing", obj=f"record {ref}")
            nl = chunk.find(b"\n")
            if nl >= 0:
                buf += chunk[:nl]
                break
            buf += chunk
            pos += len(chunk)
            if len(buf) > MAX_FRAME:
                raise CorruptRecord("journal frame is too large", obj=f"record {ref}")
        try:
            frame = orjson.loads(buf)
        except orjson.JSONDecodeError as e:
            raise CorruptRecord("journal frame is not valid JSON", obj=f"record {ref}") from e
        if not isinstance(frame, dict):
            raise CorruptRecord("journal frame is not an object", obj=f"record {ref}")
        bad = check_frame(frame)
        if bad:
            raise CorruptRecord(f"journal frame has a bad {bad}", obj=f"record {ref}")
        return frame

    def chain(self, ref: RecordRef, *, limit: int = 100_000) -> Iterator[Frame]:
        """Frames from `ref` backwards through `prev`, newest first."""
        cur: RecordRef | None = ref
        for _ in range(limit):
            if cur is None:
                return
            frame = self.read(cur)
            yield frame
            prev = frame.get("prev")
            cur = RecordRef.parse(prev) if isinstance(prev, str) else None

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def iter_segment(path: str) -> Iterator[tuple[int, Frame | None]]:
    """Every frame of one segment with its offset; None for a line that does not parse."""
    with open(path, "rb") as fh:
        off = 0
        for line in fh:
            if not line.endswith(b"\n"):
                return  # a torn last frame: the writer died mid-append; never referenced
            try:
                f = orjson.loads(line)
                # what every reader refuses (mistyped members) is unreadable here too
                yield off, f if isinstance(f, dict) and check_frame(f) is None else None
            except orjson.JSONDecodeError:
                yield off, None
            off += len(line)
