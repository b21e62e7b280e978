"""Append-only journal segments, one writer per process, and frame lookup by reference.

A frame is one orjson object on one line. A marker names the frame of its latest
transition; each frame names the one before (`prev`), so a job's history is a
backward walk and no per-job state file exists.
"""

from __future__ import annotations

import errno
import os
import secrets
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from httk_flow.errors import CorruptRecord, FlowError
from httk_flow.protocol import layout
from httk_flow.protocol.frames import BadFrame, Frame, check_frame
from httk_flow.protocol.fsio import fsync_dir
from httk_flow.protocol.layout import segment_name as segment_name  # re-exported from layout
from httk_flow.protocol.names import RecordRef, to36

#: a frame as JSON: what is appended, and what the byte layer reads back
RawFrame = dict[str, Any]
#: a frame larger than this is not ours (or is damaged); refuse it rather than buffer it
MAX_FRAME = 4 * 1024 * 1024
_READ_CHUNK = 2048
#: a writer's segments are its own: created exclusively, read back to verify appends
_SEGMENT_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC
#: segment names tried past one that someone else already made
_SEGMENT_TRIES = 64
#: appends of one batch before giving up: half in the current segment, half in fresh ones
_PLACE_TRIES = 4


class JournalWriter:
    """This process's segments under .flow/journal/<writer-id>/.

    Where a frame landed is learnt from the file after each append, never from a counter
    kept in memory: a line another process appends to our segment (a stray `echo >>`)
    must neither shift our later refs nor ever be named by one (protocol.md §5).
    """

    def __init__(
        self,
        journal_dir: str,
        *,
        durable: bool,
        segment_bytes: int,
    ) -> None:
        self._root = journal_dir
        self._durable = durable
        self._segment_bytes = segment_bytes
        self._fd = -1
        self._segment = 0
        #: where our own last line ends in the segment (what the next append lands behind
        #: unless something else appended meanwhile)
        self._end = 0
        #: move to a fresh segment before the next append (we left bytes we could not cut)
        self._rotate = False
        self.writer_id = ""
        self._dir = ""

    @property
    def _path(self) -> str:
        return os.path.join(self._dir, segment_name(self._segment))

    def _open_writer(self) -> None:
        # a fresh id per process: two writers never share a file, so appends need no lock
        while True:
            wid = to36(secrets.randbits(50))
            d = layout.writer_dir(self._root, wid)
            try:
                os.mkdir(d)
            except FileExistsError:
                continue
            except OSError as e:
                raise _append_error(e, d) from e
            self.writer_id, self._dir = wid, d
            if self._durable:
                fsync_dir(self._root)
            self._open_segment(0)
            return

    def _open_segment(self, n: int) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        # created exclusively: a segment someone else made in our directory is not ours
        # to append to (its tail may be half a line), so it is skipped
        for k in range(n, n + _SEGMENT_TRIES):
            path = os.path.join(self._dir, segment_name(k))
            try:
                self._fd = os.open(path, _SEGMENT_FLAGS, 0o644)
                break
            except FileExistsError:
                continue
            except OSError as e:
                raise _append_error(e, path) from e
        else:
            raise FlowError(
                f"cannot append to the journal: segments {n} to {k} already exist",
                obj=self._dir,
                hint="another process writes into this writer's directory; stop it",
            )
        self._segment, self._end, self._rotate = k, 0, False
        if self._durable:
            fsync_dir(self._dir)

    def append(self, frame: RawFrame) -> RecordRef:
        return self.append_many((frame,))[0]

    def append_many(self, frames: Sequence[RawFrame]) -> list[RecordRef]:
        """Append frames in one write; returns their refs. Durable mode syncs before return."""
        # encoded first: a frame that cannot be serialised writes nothing
        lines = [orjson.dumps(f) + b"\n" for f in frames]
        if not lines:
            return []
        if self._fd < 0:
            self._open_writer()
        elif self._rotate or self._end >= self._segment_bytes:
            self._open_segment(self._segment + 1)
        data = b"".join(lines)
        off = self._place(data)
        if self._durable:
            try:
                os.fsync(self._fd)
            except OSError as e:
                # a write-back error (a quota on a shared filesystem): nothing is published,
                # and the bytes the server may have half kept are not appended behind
                self._cut(data)
                raise _append_error(e, self._path) from e
        refs = []
        for line in lines:
            ref = RecordRef(self.writer_id, self._segment, off)
            refs.append(ref)
            off += len(line)
        return refs

    def _place(self, data: bytes) -> int:
        """Append `data` (whole lines) and return the offset it starts at in the file."""
        lead = b""
        for attempt in range(_PLACE_TRIES):
            if attempt >= _PLACE_TRIES // 2:
                self._open_segment(self._segment + 1)  # a fresh file nobody else writes to
                lead = b""
            calls = self._write(lead + data)
            try:
                # one O_APPEND write lands whole at the end of the file and leaves our
                # position at its end, whoever appends before or after it: exact, race-free
                end = os.lseek(self._fd, 0, os.SEEK_CUR)
            except OSError as e:
                raise _append_error(e, self._path) from e
            off, previous, self._end = end - len(data), self._end, end
            if calls == 1 and off == previous and not lead:
                return off  # right behind our own last line
            # something else appended to our segment since our last append (a stray line,
            # perhaps torn), or our write took several calls another's bytes could split:
            # name our bytes only where they start a line and are whole
            if (calls == 1 or self._ours_at(off, data)) and self._line_starts_at(off):
                return off
            # that copy stays unreferenced, so invisible; the next starts with a newline
            # if the segment now ends in the middle of someone else's line
            try:
                size = os.fstat(self._fd).st_size
            except OSError as e:
                raise _append_error(e, self._path) from e
            lead = b"" if self._line_starts_at(size) else b"\n"
        raise FlowError(
            "cannot append to the journal: another process keeps writing to its segments",
            obj=self._path,
            hint="stop whatever writes into .flow/journal, then run `flow fsck`",
        )

    def _line_starts_at(self, off: int) -> bool:
        if off == 0:
            return True
        try:
            return os.pread(self._fd, 1, off - 1) == b"\n"
        except OSError:
            return False

    def _ours_at(self, off: int, data: bytes) -> bool:
        try:
            return off >= 0 and os.pread(self._fd, len(data), off) == data
        except OSError:
            return False

    def _write(self, data: bytes) -> int:
        """Write all of `data`; returns how many write calls it took."""
        written = calls = 0
        try:
            view = memoryview(data)
            while written < len(data):
                written += os.write(self._fd, view[written:])
                calls += 1
        except OSError as e:
            # never leave half a frame for the next append to land behind
            self._cut(data[:written])
            raise _append_error(e, self._path) from e
        return calls

    def _cut(self, ours: bytes) -> None:
        """Take back bytes we appended, found by reading the file's tail, not by a
        remembered offset (that could cut another process's bytes). Where the tail is
        not ours, leave it (no ref names it) and continue in a fresh segment."""
        if not ours:
            return
        try:
            size = os.fstat(self._fd).st_size
            start = size - len(ours)
            if start >= 0 and os.pread(self._fd, len(ours), start) == ours:
                os.ftruncate(self._fd, start)
                return
        except OSError:
            pass
        self._rotate = True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _append_error(e: OSError, path: str) -> FlowError:
    what = "the disk is full" if e.errno == errno.ENOSPC else e.strerror
    return FlowError(
        f"cannot append to the journal: {what}",
        obj=path,
        hint="free space in the workspace and start the command again",
    )


class JournalReader:
    """Reads frames by reference through a small cache of open segment handles, and the
    last RECENT frames this process made a job ready with, kept parsed: a manager reads
    back the frame that made a job ready when it claims the job, usually moments later."""

    RECENT = 4096  # as many as the specs a manager keeps for the claim (SpecCache)

    def __init__(self, journal_dir: str, *, cache: int = 64) -> None:
        self._root = journal_dir
        self._fds: OrderedDict[tuple[str, int], int] = OrderedDict()
        self._cache = cache
        self._recent: dict[RecordRef, Frame] = {}

    def remember(self, ref: RecordRef, frame: Frame) -> None:
        """The frame this process's writer placed at `ref` (learnt from the file, §5): the
        bytes there are `frame` serialised, and parsing them gives `frame` back (a property
        tests/test_kept_frames.py checks), so frame(ref) returns it without reading or parsing."""
        recent = self._recent
        recent[ref] = frame
        if len(recent) > self.RECENT:
            del recent[next(iter(recent))]  # the oldest: dicts keep insertion order

    def _fd(self, writer: str, segment: int) -> int:
        k = (writer, segment)
        fd = self._fds.get(k)
        if fd is not None:
            self._fds.move_to_end(k)
            return fd
        path = layout.segment_path(self._root, writer, segment)
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

    def read(self, ref: RecordRef) -> RawFrame:
        """The frame `ref` names as JSON, its members' shapes checked (check_frame)."""
        frame = self._object(ref)
        bad = check_frame(frame)
        if bad:
            raise CorruptRecord(f"journal frame has a bad {bad}", obj=f"record {ref}")
        return frame

    def _object(self, ref: RecordRef) -> RawFrame:
        try:
            frame = orjson.loads(self._pread(ref))
        except orjson.JSONDecodeError as e:
            raise CorruptRecord("journal frame is not valid JSON", obj=f"record {ref}") from e
        if not isinstance(frame, dict):
            raise CorruptRecord("journal frame is not an object", obj=f"record {ref}")
        return frame

    def _pread(self, ref: RecordRef) -> bytes:
        """The line at `ref`, read from its segment up to (not including) its newline."""
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
        return buf

    def frame(self, ref: RecordRef) -> Frame:
        """The frame `ref` names, parsed; CorruptRecord if it is not a whole frame."""
        kept = self._recent.get(ref)
        if kept is not None:
            return kept
        try:
            # Frame.from_json checks every member check_frame does, so the frame is parsed once
            return Frame.from_json(self._object(ref))
        except BadFrame as e:
            raise CorruptRecord(f"journal frame has a bad {e.top}", obj=f"record {ref}") from None

    def chain(self, ref: RecordRef, *, limit: int = 100_000) -> Iterator[Frame]:
        """Frames from `ref` backwards through `prev`, newest first."""
        cur: RecordRef | None = ref
        for _ in range(limit):
            if cur is None:
                return
            frame = self.frame(cur)
            yield frame
            cur = frame.prev

    def chain_json(self, ref: RecordRef, *, limit: int = 100_000) -> Iterator[RawFrame]:
        """As chain(), as written: for tools that show frames as JSON."""
        for cur in self.refs(ref, limit=limit):
            yield self.read(cur)

    def refs(self, ref: RecordRef, *, limit: int = 100_000) -> Iterator[RecordRef]:
        """`ref` and the references back through `prev` for as long as frames read as
        JSON: what a job's history reaches, even where a member is of a shape this
        version refuses (so that gc never deletes what an older frame still names)."""
        cur: RecordRef | None = ref
        for _ in range(limit):
            if cur is None:
                return
            yield cur
            try:
                prev = self.read(cur).get("prev")
                cur = RecordRef.parse(prev) if isinstance(prev, str) else None
            except FlowError:
                return

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def iter_segment(path: str) -> Iterator[tuple[int, RawFrame | None]]:
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
