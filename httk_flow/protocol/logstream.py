"""Streamed output (policy `logs: stream`, protocol.md §10): an attempt's output appended
to its manager's log segments at its commit, so that a finished job keeps no file of it.

A segment `.flow/logs/<writer>/<n>.log` is written by one process only (the writer id of
its journal), in records: one JSON header line `{"job", "key", "placement", "attempt",
"stream", "len"}`, then
`len` bytes of output, then a newline. A record is found by the reference the job's final
frame holds (`logs`), and read only when its header names that job, attempt and stream and
its bytes are all there: a torn or foreign record reads as missing, never as output.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import orjson

from httk_flow.protocol import layout
from httk_flow.protocol.fsio import fsync_dir
from httk_flow.protocol.names import RecordRef

#: output larger than this stays a file (aNNNN.stdout): copying it costs more than its inode
MAX_STREAMED = 4 * 1024 * 1024
#: the streams an attempt has
STREAMS = ("stdout", "stderr")
#: (stream, record) of each output a commit streamed: a final frame's `logs`
Streamed = tuple[tuple[str, RecordRef], ...]
_MAX_HEADER = 512
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class Header:
    """A record's header: whose output it is, and how many bytes follow."""

    job: str
    key: str
    placement: str
    attempt: int
    stream: str
    length: int

    def to_bytes(self) -> bytes:
        return orjson.dumps(
            {
                "job": self.job,
                "key": self.key,
                "placement": self.placement,
                "attempt": self.attempt,
                "stream": self.stream,
                "len": self.length,
            }
        )

    @classmethod
    def parse(cls, line: bytes) -> Header | None:
        try:
            d = orjson.loads(line)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(d, dict):
            return None
        job, key, placement = d.get("job"), d.get("key"), d.get("placement")
        n, stream, length = d.get("attempt"), d.get("stream"), d.get("len")
        if not all(isinstance(v, str) for v in (job, key, placement, stream)):
            return None
        if stream not in STREAMS or type(n) is not int or type(length) is not int:
            return None
        if n < 1 or length < 0:
            return None
        return cls(job, key, placement, n, stream, length)  # type: ignore[arg-type]


def logs_dir(root: str) -> str:
    """Streamed output: one directory of segments per writer."""
    return os.path.join(layout.flow_dir(root), "logs")


def writer_dir(root: str, writer: str) -> str:
    """One writer's log segments (named by the id of its journal writer)."""
    return os.path.join(logs_dir(root), writer)


def segment_name(n: int) -> str:
    return f"{n}.log"


def segment_number(name: str) -> int | None:
    """The number of a log segment by its file name; None when it names none."""
    stem, dot, ext = name.partition(".")
    if dot and ext == "log" and stem.isdigit() and name == segment_name(int(stem)):
        return int(stem)
    return None


class LogWriter:
    """This process's log segments, under the id of its journal writer."""

    def __init__(self, root: str, writer: str, *, durable: bool, segment_bytes: int) -> None:
        self._dir = writer_dir(root, writer)
        self._writer = writer
        self._durable = durable
        self._segment_bytes = segment_bytes
        self._fd = -1
        self._segment = -1
        self._end = 0

    def append(self, head: Header, data: bytes) -> RecordRef:
        """Append one record (`head.length` is len(data)); its reference. Durable mode
        syncs it before return."""
        record = head.to_bytes() + b"\n" + data + b"\n"
        if self._fd < 0 or self._end >= self._segment_bytes or _unlinked(self._fd):
            self._open(self._segment + 1)
        off = self._end
        try:
            view = memoryview(record)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            if self._durable:
                os.fsync(self._fd)
        except OSError:
            self.close()  # a torn tail ends this segment: the next record starts a new one
            raise
        self._end += len(record)
        return RecordRef(self._writer, self._segment, off)

    def _open(self, n: int) -> None:
        self.close()
        os.makedirs(self._dir, exist_ok=True)
        while True:  # made exclusively: a segment someone else made is not ours
            path = os.path.join(self._dir, segment_name(n))
            try:
                self._fd = os.open(path, _FLAGS, 0o644)
                break
            except FileExistsError:
                n += 1
        self._segment, self._end = n, 0
        if self._durable:
            fsync_dir(self._dir)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _unlinked(fd: int) -> bool:
    """The segment was removed under us (`flow gc` of an idle writer's old segment)."""
    try:
        return os.fstat(fd).st_nlink == 0
    except OSError:
        return True


def read_record(root: str, ref: RecordRef, job: str, attempt: int, stream: str) -> bytes | None:
    """The output a reference points at, when the record there is whole and is that job's
    attempt's stream; None otherwise (collected, torn, or not what the frame said)."""
    path = os.path.join(writer_dir(root, ref.writer), segment_name(ref.segment))
    try:
        with open(path, "rb") as fh:
            fh.seek(ref.offset)
            line = fh.readline(_MAX_HEADER)
            head = Header.parse(line) if line.endswith(b"\n") else None
            if head is None or (head.job, head.attempt, head.stream) != (job, attempt, stream):
                return None
            data = fh.read(head.length + 1)
    except OSError:
        return None
    if len(data) != head.length + 1 or not data.endswith(b"\n"):
        return None
    return data[:-1]


def iter_headers(path: str) -> Iterator[Header | None]:
    """The headers of a segment's records in order; None for a tail that is not a whole
    record (a writer killed mid-append), after which nothing is read."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 (a generator: closed by the with below)
    except OSError:
        return
    with fh:
        size = os.fstat(fh.fileno()).st_size
        while fh.tell() < size:
            line = fh.readline(_MAX_HEADER)
            head = Header.parse(line) if line.endswith(b"\n") else None
            if head is None or fh.tell() + head.length + 1 > size:
                yield None
                return
            fh.seek(head.length + 1, os.SEEK_CUR)
            yield head
