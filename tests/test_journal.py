"""journal: append-only segments, frames read back by reference, chains walked backwards."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import orjson
import pytest

from httk_flow.errors import CorruptRecord, FlowError
from httk_flow.protocol.frames import Body, Frame, Snapshot
from httk_flow.protocol.journal import JournalReader, JournalWriter, iter_segment, segment_name
from httk_flow.protocol.names import RecordRef
from httk_flow.protocol.states import State


@pytest.fixture
def journal(tmp_path: Path) -> str:
    d = tmp_path / "journal"
    d.mkdir()
    return str(d)


def _writer(journal: str, segment_bytes: int = 1 << 20, durable: bool = False) -> JournalWriter:
    return JournalWriter(journal, durable=durable, segment_bytes=segment_bytes)


@pytest.mark.parametrize("durable", [False, True])
def test_an_appended_frame_reads_back_by_its_ref(journal: str, durable: bool) -> None:
    w = _writer(journal, durable=durable)
    ref = w.append({"job": "a", "n": 1, "text": "ünïcode"})
    r = JournalReader(journal)
    assert r.read(ref) == {"job": "a", "n": 1, "text": "ünïcode"}
    assert ref.writer == w.writer_id
    assert RecordRef.parse(str(ref)) == ref
    w.close()
    r.close()


def test_append_many_writes_frames_contiguously_and_returns_one_ref_each(journal: str) -> None:
    w = _writer(journal)
    first = w.append({"i": -1})
    refs = w.append_many([{"i": i, "pad": "x" * i} for i in range(50)])
    assert len(refs) == 50
    assert refs == sorted(refs)
    assert refs[0].offset > first.offset
    r = JournalReader(journal)
    assert [r.read(ref)["i"] for ref in refs] == list(range(50))
    path = os.path.join(journal, w.writer_id, segment_name(0))
    assert [off for off, _ in iter_segment(path)] == [first.offset] + [x.offset for x in refs]


def test_two_writers_never_share_a_directory(journal: str) -> None:
    a, b = _writer(journal), _writer(journal)
    ra, rb = a.append({"w": "a"}), b.append({"w": "b"})
    assert ra.writer != rb.writer
    assert sorted(os.listdir(journal)) == sorted([ra.writer, rb.writer])
    r = JournalReader(journal)
    assert (r.read(ra), r.read(rb)) == ({"w": "a"}, {"w": "b"})


def test_a_writer_rotates_to_a_new_segment_past_its_size(journal: str) -> None:
    w = _writer(journal, segment_bytes=300)
    refs = [w.append({"i": i, "pad": "y" * 40}) for i in range(40)]
    segments = sorted({ref.segment for ref in refs})
    assert len(segments) > 5
    assert segments == list(range(len(segments)))
    files = sorted(os.listdir(os.path.join(journal, w.writer_id)))
    assert files == sorted(segment_name(n) for n in segments)
    for name in files:
        # a segment only grows past its size by the frame that crossed the line
        assert os.path.getsize(os.path.join(journal, w.writer_id, name)) < 300 + 80
    r = JournalReader(journal, cache=2)  # a small cache forces reopening segments
    for i, ref in enumerate(refs):
        assert r.read(ref)["i"] == i
    for i, ref in reversed(list(enumerate(refs))):
        assert r.read(ref)["i"] == i


def _tear(journal: str, w: JournalWriter, partial: bytes) -> RecordRef:
    """Append half a frame by hand, as a writer killed mid-write would leave it."""
    path = os.path.join(journal, w.writer_id, segment_name(0))
    offset = os.path.getsize(path)
    with open(path, "ab") as fh:
        fh.write(partial)
    return RecordRef(w.writer_id, 0, offset)


def test_a_torn_last_frame_is_a_corrupt_record_and_iter_segment_skips_it(journal: str) -> None:
    w = _writer(journal)
    good = w.append_many([{"i": 0}, {"i": 1}])
    torn = _tear(journal, w, b'{"i": 2, "pad": "' + b"z" * 5000)
    r = JournalReader(journal)
    with pytest.raises(CorruptRecord) as info:
        r.read(torn)
    assert str(torn) in str(info.value)
    assert [r.read(ref) for ref in good] == [{"i": 0}, {"i": 1}]
    path = os.path.join(journal, w.writer_id, segment_name(0))
    assert list(iter_segment(path)) == [(good[0].offset, {"i": 0}), (good[1].offset, {"i": 1})]


def test_a_line_that_is_not_a_json_object_is_reported_not_trusted(journal: str) -> None:
    w = _writer(journal)
    w.append({"i": 0})
    path = os.path.join(journal, w.writer_id, segment_name(0))
    with open(path, "ab") as fh:
        bad_json, not_object = fh.tell(), fh.tell() + len(b"{nope\n")
        fh.write(b"{nope\n[1, 2]\n")
    r = JournalReader(journal)
    with pytest.raises(CorruptRecord):
        r.read(RecordRef(w.writer_id, 0, bad_json))
    with pytest.raises(CorruptRecord):
        r.read(RecordRef(w.writer_id, 0, not_object))
    assert [f for _, f in iter_segment(path)] == [{"i": 0}, None, None]


def test_a_ref_to_a_missing_writer_or_segment_is_a_corrupt_record(journal: str) -> None:
    w = _writer(journal)
    ref = w.append({"i": 0})
    r = JournalReader(journal)
    for missing in (RecordRef("nosuchwriter", 0, 0), RecordRef(ref.writer, 7, 0)):
        with pytest.raises(CorruptRecord):
            r.read(missing)
    with pytest.raises(CorruptRecord):
        r.read(RecordRef(ref.writer, 0, 10_000))  # past the end of the segment


def test_a_frame_past_the_size_limit_is_refused_rather_than_buffered(
    journal: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httk_flow.protocol.journal as journal_mod

    monkeypatch.setattr(journal_mod, "MAX_FRAME", 10_000)
    w = _writer(journal)
    ref = w.append({"pad": "q" * 50_000})
    with pytest.raises(CorruptRecord):
        JournalReader(journal).read(ref)


def test_a_frame_spanning_many_read_chunks_reads_back_whole(journal: str) -> None:
    w = _writer(journal)
    big = {"pad": "p" * 100_000, "tail": [1, 2, 3]}
    refs = w.append_many([{"i": 0}, big, {"i": 2}])
    r = JournalReader(journal)
    assert r.read(refs[1]) == big
    assert r.read(refs[2]) == {"i": 2}


def test_a_chain_walks_backwards_through_prev_across_segments(journal: str) -> None:
    w = _writer(journal, segment_bytes=200)
    prev: str | None = None
    refs = []
    for gen in range(25):
        ref = w.append({"gen": gen, "prev": prev, "pad": "c" * 30})
        refs.append(ref)
        prev = str(ref)
    assert refs[-1].segment > 3
    r = JournalReader(journal)
    assert [f["gen"] for f in r.chain_json(refs[-1])] == list(range(24, -1, -1))
    assert [f["gen"] for f in r.chain_json(refs[10])] == list(range(10, -1, -1))
    assert [f["gen"] for f in r.chain_json(refs[-1], limit=3)] == [24, 23, 22]


def test_a_chain_that_reaches_a_torn_frame_reports_it(journal: str) -> None:
    w = _writer(journal)
    w.append({"gen": -1})
    torn = _tear(journal, w, b'{"gen": 0')
    w2 = _writer(journal)
    head = w2.append({"gen": 1, "prev": str(torn)})
    frames = JournalReader(journal).chain_json(head)
    assert next(frames) == {"gen": 1, "prev": str(torn)}
    with pytest.raises(CorruptRecord):
        next(frames)


def test_a_frame_that_cannot_be_encoded_writes_nothing(journal: str) -> None:
    w, ok, path = _after_one_frame(journal)
    size = os.path.getsize(path)
    with pytest.raises(TypeError):
        w.append({"i": object()})  # not serialisable: nothing is written
    assert os.path.getsize(path) == size
    after = w.append({"i": 1})
    assert after.offset == size
    r = JournalReader(journal)
    assert (r.read(ok), r.read(after)) == ({"i": 0}, {"i": 1})
    assert [orjson.loads(line) for line in Path(path).read_bytes().splitlines()] == [
        {"i": 0},
        {"i": 1},
    ]


# -- another process appending to our segment -----------------------------------------------


def _segment(journal: str, w: JournalWriter, n: int = 0) -> str:
    return os.path.join(journal, w.writer_id, segment_name(n))


def _after_one_frame(journal: str) -> tuple[JournalWriter, RecordRef, str]:
    """A writer that has appended {"i": 0}: it, that frame's ref and its segment's path."""
    w = _writer(journal)
    return w, w.append({"i": 0}), _segment(journal, w)


def _foreign(path: str, data: bytes) -> int:
    """Append `data` as another process would (`echo >> segment`); returns where it went."""
    with open(path, "ab") as fh:
        offset = fh.tell()
        fh.write(data)
    return offset


def _our_lines(path: str) -> dict[int, dict[str, object]]:
    """offset -> frame of every line of the segment that parses as one."""
    return {off: f for off, f in iter_segment(path) if f is not None}


def test_a_foreign_line_between_appends_shifts_no_later_ref(journal: str) -> None:
    w = _writer(journal)
    refs = w.append_many([{"i": 0}, {"i": 1}])
    stray = _foreign(_segment(journal, w), b"a stray line from someone's echo\n")
    refs += w.append_many([{"i": 2}, {"i": 3}])
    refs.append(w.append({"i": 4}))
    r = JournalReader(journal)
    assert [r.read(ref)["i"] for ref in refs] == [0, 1, 2, 3, 4]
    assert stray not in {ref.offset for ref in refs}
    lines = list(iter_segment(_segment(journal, w)))
    assert (stray, None) in lines
    assert _our_lines(_segment(journal, w)) == {ref.offset: {"i": i} for i, ref in enumerate(refs)}


def test_a_foreign_torn_line_never_glues_itself_to_our_next_frame(journal: str) -> None:
    w = _writer(journal)
    first = w.append({"i": 0})
    torn = _foreign(_segment(journal, w), b'{"half of a line without its newline')
    refs = [first, *w.append_many([{"i": 1}, {"i": 2}]), w.append({"i": 3})]
    r = JournalReader(journal)
    assert [r.read(ref)["i"] for ref in refs] == [0, 1, 2, 3]
    path = _segment(journal, w)
    data = Path(path).read_bytes()
    for ref in refs:
        # every frame starts a line of its own: a scan of the segment sees it too
        assert ref.offset == 0 or data[ref.offset - 1 : ref.offset] == b"\n"
    # (the copy that was glued to the torn bytes stays, unreferenced: invisible)
    assert {ref.offset: {"i": i} for i, ref in enumerate(refs)}.items() <= _our_lines(path).items()
    # the torn bytes, with the copy glued to them, are one line that is no frame
    assert (torn, None) in list(iter_segment(path))
    assert all(ref.offset > torn for ref in refs[1:])


class _Racer:
    """Another process that appends `what` to the segment right after each of our writes
    (between our write and our look at the file's size), `times` times."""

    def __init__(self, path: str, what: bytes, times: int = 1) -> None:
        self.path, self.what, self.left = path, what, times
        self.at: list[int] = []

    def install(self, monkeypatch: pytest.MonkeyPatch, fd_of: JournalWriter) -> None:
        real = os.write

        def write(fd: int, data: bytes | memoryview) -> int:
            n = real(fd, data)
            if fd == fd_of._fd and self.left > 0:
                self.left -= 1
                self.at.append(_foreign(self.path, self.what))
            return n

        monkeypatch.setattr(os, "write", write)


@pytest.mark.parametrize(
    "what", [b"a stray line\n", b"torn, no newline"], ids=["line", "torn line"]
)
def test_a_foreign_append_racing_ours_is_found_out_and_never_named(
    journal: str, monkeypatch: pytest.MonkeyPatch, what: bytes
) -> None:
    w = _writer(journal)
    refs = [w.append({"i": 0})]
    racer = _Racer(_segment(journal, w), what, times=3)
    racer.install(monkeypatch, w)
    for i in range(1, 6):
        refs.append(w.append({"i": i, "pad": "r" * i}))
    assert len(racer.at) == 3
    r = JournalReader(journal)
    assert [r.read(ref)["i"] for ref in refs] == list(range(6))
    assert not {ref.offset for ref in refs} & set(racer.at)
    assert {ref.segment for ref in refs} == {0}
    assert set(_our_lines(_segment(journal, w))) >= {ref.offset for ref in refs}


def test_a_short_write_split_by_a_foreign_line_is_never_named(
    journal: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    w, first, path = _after_one_frame(journal)
    real = os.write
    split = [True]

    def write(fd: int, data: bytes | memoryview) -> int:
        if fd != w._fd or not split[0]:
            return real(fd, data)
        split[0] = False
        n = real(fd, bytes(data[:4]))  # a short write (a signal, a nearly full disk)...
        _foreign(path, b"a foreign line in the gap\n")  # ...and someone appends in the gap
        return n

    monkeypatch.setattr(os, "write", write)
    ref = w.append({"i": 1, "pad": "s" * 50})
    r = JournalReader(journal)
    assert (r.read(first)["i"], r.read(ref)["i"]) == (0, 1)
    data = Path(path).read_bytes()
    assert data[ref.offset - 1 : ref.offset] == b"\n"
    assert data.index(b"a foreign line in the gap") < ref.offset


def test_a_writer_whose_segment_is_written_without_pause_moves_to_a_fresh_one(
    journal: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = _writer(journal)
    w.append({"i": 0})
    # before and after every write of ours: where our bytes went cannot be told from sizes
    real = os.write
    path = _segment(journal, w)

    def write(fd: int, data: bytes | memoryview) -> int:
        if fd == w._fd and os.fstat(fd).st_ino == os.stat(path).st_ino:
            _foreign(path, b"x")
            n = real(fd, data)
            _foreign(path, b"y\n")
            return n
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    ref = w.append({"i": 1})
    assert ref.segment > 0
    assert JournalReader(journal).read(ref) == {"i": 1}


def test_a_segment_someone_else_made_in_our_directory_is_skipped(journal: str) -> None:
    w = _writer(journal, segment_bytes=100)
    first = w.append({"i": 0, "pad": "s" * 120})
    planted = _segment(journal, w, 1)
    Path(planted).write_bytes(b'{"not": "ours", "and torn')
    second = w.append({"i": 1})
    assert (first.segment, second.segment) == (0, 2)
    assert Path(planted).read_bytes() == b'{"not": "ours", "and torn'
    r = JournalReader(journal)
    assert (r.read(first)["i"], r.read(second)["i"]) == (0, 1)


class _FullDisk:
    """The next write of `w` stores only `keep` bytes (a short write), and the write of the
    rest fails as on a full disk; `before` and `after` are appended by another process just
    ahead of our write and just after its short part."""

    def __init__(self, w: JournalWriter, path: str, keep: int, before: bytes, after: bytes):
        self.w, self.path, self.keep = w, path, keep
        self.before, self.after = before, after
        self.calls = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real = os.write

        def write(fd: int, data: bytes | memoryview) -> int:
            if fd != self.w._fd or self.calls >= 2:
                return real(fd, data)
            self.calls += 1
            if self.calls == 1:
                _foreign(self.path, self.before)
                n = real(fd, bytes(data[: self.keep]))
                _foreign(self.path, self.after)
                return n
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "write", write)


def test_a_failed_append_cuts_only_its_own_bytes_never_a_foreign_line(
    journal: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    w, ok, path = _after_one_frame(journal)
    _FullDisk(w, path, keep=7, before=b"a foreign line\n", after=b"").install(monkeypatch)
    with pytest.raises(FlowError, match="disk is full"):
        w.append({"i": 1, "pad": "f" * 100})
    # our 7 bytes are gone; the foreign line before them (past our last frame) is not
    assert Path(path).read_bytes() == b'{"i":0}\na foreign line\n'
    after = w.append({"i": 2})
    r = JournalReader(journal)
    assert (r.read(ok), r.read(after)) == ({"i": 0}, {"i": 2})
    assert after.segment == 0
    assert Path(path).read_bytes() == b'{"i":0}\na foreign line\n{"i":2}\n'


def test_a_failed_append_that_cannot_be_cut_alone_is_left_behind_a_fresh_segment(
    journal: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    w, ok, path = _after_one_frame(journal)
    behind = b"a foreign line after our half frame\n"
    _FullDisk(w, path, keep=5, before=b"", after=behind).install(monkeypatch)
    with pytest.raises(FlowError, match="disk is full"):
        w.append({"i": 1, "pad": "g" * 100})
    # cutting our 5 bytes would cut the line behind them too: both stay, named by no ref
    assert Path(path).read_bytes() == b'{"i":0}\n{"i":' + behind
    after = w.append({"i": 2})
    assert after.segment == 1, "appended behind a half frame it could not take back"
    r = JournalReader(journal)
    assert (r.read(ok), r.read(after)) == ({"i": 0}, {"i": 2})


@pytest.mark.parametrize(
    ("change", "member"),
    [
        ({"job": 5}, "job"),
        ({"to": "flying"}, "to"),
        ({"gen": -1}, "gen"),
        ({"t": "noon"}, "t"),
        ({"prev": 7}, "prev"),
        ({"attempt": {"n": "one"}}, "attempt"),
        ({"try": -1}, "try"),
    ],
)
def test_a_frame_read_as_one_says_what_a_raw_read_says_of_a_bad_member(
    journal: str, change: dict[str, object], member: str
) -> None:
    # frame() parses once, trusting Frame.from_json to refuse what check_frame refuses
    good = Frame(
        job="j" * 32,
        key="j" * 32,
        placement="jobs/jj",
        source=State.READY,
        to=State.CLAIMED,
        gen=2,
        prev=None,
        t=1.5,
        by="m1",
        body=Body(Snapshot(step="main")),
    ).to_json()
    w = _writer(journal)
    ok, bad = w.append(good), w.append({**good, **change})
    r = JournalReader(journal)
    assert r.frame(ok).to_json() == good
    with pytest.raises(CorruptRecord) as raw:
        r.read(bad)
    with pytest.raises(CorruptRecord) as parsed:
        r.frame(bad)
    assert str(parsed.value) == str(raw.value)
    assert f"journal frame has a bad member {member!r}" in str(parsed.value)
