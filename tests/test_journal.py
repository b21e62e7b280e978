"""journal: append-only segments, frames read back by reference, chains walked backwards."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from httk_flow.errors import CorruptRecord
from httk_flow.journal import JournalReader, JournalWriter, iter_segment, segment_name
from httk_flow.names import RecordRef


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
    import httk_flow.journal as journal_mod

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
    assert [f["gen"] for f in r.chain(refs[-1])] == list(range(24, -1, -1))
    assert [f["gen"] for f in r.chain(refs[10])] == list(range(10, -1, -1))
    assert [f["gen"] for f in r.chain(refs[-1], limit=3)] == [24, 23, 22]


def test_a_chain_that_reaches_a_torn_frame_reports_it(journal: str) -> None:
    w = _writer(journal)
    w.append({"gen": -1})
    torn = _tear(journal, w, b'{"gen": 0')
    w2 = _writer(journal)
    head = w2.append({"gen": 1, "prev": str(torn)})
    frames = JournalReader(journal).chain(head)
    assert next(frames) == {"gen": 1, "prev": str(torn)}
    with pytest.raises(CorruptRecord):
        next(frames)


def test_a_frame_that_cannot_be_encoded_writes_nothing(journal: str) -> None:
    w = _writer(journal)
    ok = w.append({"i": 0})
    path = os.path.join(journal, w.writer_id, segment_name(0))
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
