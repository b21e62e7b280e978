"""The disk fills up while the journal is appended to: the append fails with a FlowError
that says so, the segment is cut back to its last whole frame, and no marker is renamed
to name a frame that is not there. Runs on a 256 KiB tmpfs (root may mount one); where no
tmpfs can be mounted, RLIMIT_FSIZE in a child process makes the same short write fail."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from helpers import fill_disk, small_tmpfs

from httk_flow.errors import FlowError
from httk_flow.protocol.frames import Body
from httk_flow.protocol.journal import JournalReader, JournalWriter, iter_segment
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.transition import transition
from httk_flow.protocol.workspace import Workspace

from .support import handles

PAD = "x" * 3000  # frames this large cross a page boundary within a few appends


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "tmpfs", "size=256k") as mnt:
        yield mnt


def _whole_frames(segment: str) -> list[dict[str, object]]:
    """Every line of the segment parses, and the file ends with a newline."""
    data = Path(segment).read_bytes()
    assert not data or data.endswith(b"\n"), "a half frame was left behind"
    frames = []
    for off, frame in iter_segment(segment):
        assert frame is not None, f"damaged frame at {off}"
        frames.append(frame)
    return frames


def test_a_full_disk_fails_the_append_and_leaves_no_half_frame(
    small_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cuts: list[tuple[int, int]] = []
    real_ftruncate = os.ftruncate

    def ftruncate(fd: int, length: int) -> None:
        cuts.append((os.fstat(fd).st_size, length))
        real_ftruncate(fd, length)

    monkeypatch.setattr(os, "ftruncate", ftruncate)
    writer = JournalWriter(str(small_disk / "journal"), durable=False, segment_bytes=1 << 30)
    os.makedirs(small_disk / "journal")
    refs = [writer.append({"n": i, "pad": PAD}) for i in range(3)]
    filler = fill_disk(small_disk, 4096)
    with pytest.raises(FlowError) as caught:
        for i in range(3, 200):
            refs.append(writer.append({"n": i, "pad": PAD}))
    assert "disk is full" in caught.value.message
    assert isinstance(caught.value.__cause__, OSError)
    assert caught.value.__cause__.errno == errno.ENOSPC
    assert cuts and cuts[-1][0] > cuts[-1][1], f"no half frame was written to cut: {cuts}"
    segment = os.path.join(small_disk, "journal", writer.writer_id, "0.jsonl")
    frames = _whole_frames(segment)
    assert [f["n"] for f in frames] == list(range(len(refs)))
    reader = JournalReader(str(small_disk / "journal"))
    assert [reader.read(r)["n"] for r in refs] == list(range(len(refs)))
    # space comes back: the next append lands right after the last whole frame
    filler.unlink()
    ref = writer.append({"n": "after", "pad": PAD})
    assert reader.read(ref)["n"] == "after"
    assert [f["n"] for f in _whole_frames(segment)][-1] == "after"
    writer.close()
    reader.close()


def test_a_transition_that_cannot_be_journaled_leaves_its_marker_alone(
    small_disk: Path, tmp_path: Path
) -> None:
    prog = tmp_path / "ok.sh"
    prog.write_text("#!/bin/sh\nexit 0\n")
    prog.chmod(0o755)
    ws = Workspace.create(str(small_disk / "ws"))
    try:
        specs = list(Submitter(ws).submit([SubmitRequest(program=str(prog)) for _ in range(3)]))
        before = {h.key: h for h in handles(ws.root)}
        filler = fill_disk(small_disk, 4096)
        moved, failures = 0, 0
        for h in before.values():
            try:
                transition(ws, h, State.READY, Body(extra=(("pad", PAD * 4),)), actor="test")
                moved += 1
            except FlowError as e:
                failures += 1
                assert "disk is full" in e.message
        assert failures, "the disk never filled"
        # nothing half-published: every marker names a frame that reads back whole
        reader = JournalReader(ws.journal_dir)
        for h in handles(ws.root):
            frame = reader.read(h.marker.ref)
            assert frame["key"] == h.key and frame["to"] == h.state.value
        assert sum(h.state is State.READY for h in handles(ws.root)) == moved
        for w in os.listdir(ws.journal_dir):
            for seg in os.listdir(os.path.join(ws.journal_dir, w)):
                _whole_frames(os.path.join(ws.journal_dir, w, seg))
        filler.unlink()
        for h in handles(ws.root):
            if h.state is State.SUBMITTED:
                transition(ws, h, State.READY, Body(), actor="test")
        assert {h.state for h in handles(ws.root)} == {State.READY}
        assert len(specs) == 3
        reader.close()
    finally:
        ws.close()


#: a child whose files may not grow past 20 KiB: the write past it is cut short, then fails
RLIMIT_CHILD = textwrap.dedent(
    """
    import os, resource, signal, sys
    import orjson
    from httk_flow.errors import FlowError
    from httk_flow.protocol.journal import JournalWriter
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20 * 1024, 20 * 1024))
    w = JournalWriter(sys.argv[1], durable=False, segment_bytes=1 << 30)
    refs = []
    try:
        for i in range(100):
            refs.append(str(w.append({"n": i, "pad": "x" * 3000})))
    except FlowError as e:
        print(orjson.dumps({"refs": refs, "error": e.message, "writer": w.writer_id}).decode())
    """
)


def test_a_short_write_is_cut_back_under_a_file_size_limit(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    journal.mkdir()
    r = subprocess.run(
        [sys.executable, "-c", RLIMIT_CHILD, str(journal)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    out = orjson.loads(r.stdout)
    assert "cannot append" in out["error"]
    segment = journal / out["writer"] / "0.jsonl"
    assert 0 < segment.stat().st_size <= 20 * 1024
    frames = _whole_frames(str(segment))
    assert len(frames) == len(out["refs"]) > 0
