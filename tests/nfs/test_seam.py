"""Which reads and listings reach the FileSystem seam that NFS models are installed at."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers import plant_marker

from httk_flow.protocol.children import child_placement, child_states
from httk_flow.protocol.counting import count_markers
from httk_flow.protocol.discovery import MarkerStream
from httk_flow.protocol.fsio import READ_ATTEMPTS, FileSystem, fs, set_filesystem
from httk_flow.protocol.leases import read_managers
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import locate_key
from httk_flow.protocol.workspace import Workspace

from .faultfs import LateNames, Recorder


def test_heartbeats_are_listed_through_the_seam(tmp_path: Path) -> None:
    ws = Workspace.create(str(tmp_path / "ws"))
    rec = Recorder()
    set_filesystem(rec)
    read_managers(ws)
    assert ws.managers in rec.listed
    ws.close()


def test_flow_requests_lists_through_the_seam(tmp_path: Path) -> None:
    """Public behaviour only: whatever layout requests have, `flow requests` lists it
    through the seam, so an NFS model sees the request directories too."""
    from httk_flow.cli.main import cli

    ws = Workspace.create(str(tmp_path / "ws"))
    for sub in ("", "new", "done"):
        os.makedirs(os.path.join(ws.requests, sub), exist_ok=True)
    rec = Recorder()
    set_filesystem(rec)
    r = CliRunner().invoke(cli, ["-w", ws.root, "requests"])
    assert r.exit_code == 0, r.output
    assert any(p.startswith(ws.requests) for p in rec.listed), rec.listed
    ws.close()


def test_marker_discovery_lists_through_the_seam(tmp_path: Path) -> None:
    ws = Workspace.create(str(tmp_path / "ws"))
    plant_marker(ws, State.READY, "jobs/abc")
    rec = Recorder()
    set_filesystem(rec)
    stream = MarkerStream(ws, State.READY)
    found = stream.next_batch(100)
    stream.close()
    assert len(found) == 1
    assert ws.state_dir(State.READY) in rec.listed
    assert ws.state_dir(State.READY, "jobs/abc") in rec.listed
    rec.listed.clear()
    assert count_markers(ws, State.READY) == 1
    assert ws.state_dir(State.READY, "jobs/abc") in rec.listed
    ws.close()


def test_the_seam_hands_out_real_dir_entries(tmp_path: Path) -> None:
    """The plain filesystem adds no layer to the walk: os.scandir's own iterator and
    DirEntry objects (cached d_type, no stat per entry), and a missing directory raises
    at the call, as os.scandir does."""
    (tmp_path / "f").write_text("x")
    it = fs.scandir(str(tmp_path))
    try:
        [e] = list(it)
    finally:
        it.close()  # type: ignore[attr-defined]
    assert isinstance(e, os.DirEntry)
    try:
        fs.scandir(str(tmp_path / "missing"))
    except FileNotFoundError:
        pass
    else:
        raise AssertionError("a missing directory must raise at the call")


def test_locating_a_job_and_its_children_lists_through_the_seam(tmp_path: Path) -> None:
    ws = Workspace.create(str(tmp_path / "ws"))
    h = plant_marker(ws, State.WAITING, "jobs/abc")
    rec = Recorder()
    set_filesystem(rec)
    assert locate_key(ws, h.placement, h.key) == h
    assert ws.state_dir(State.WAITING, h.placement) in rec.listed
    rec.listed.clear()
    [child] = child_states(ws, h.placement, h.key, h.job_id, 1, ["a"])
    assert child.state is None
    kids = child_placement(h.placement, h.key)
    assert {ws.state_dir(st, kids) for st in State} <= set(rec.listed)
    ws.close()


def test_a_model_installed_at_the_seam_delays_what_discovery_finds(tmp_path: Path) -> None:
    """The point of the seam: a late name is hidden from the marker walk itself."""
    ws = Workspace.create(str(tmp_path / "ws"))
    now = [0.0]
    set_filesystem(LateNames(late=10.0, clock=lambda: now[0]))
    plant_marker(ws, State.READY, "jobs/abc")
    first = MarkerStream(ws, State.READY)
    assert len(first.next_batch(100)) == 1  # a directory's first listing is the truth
    first.close()
    h = plant_marker(ws, State.READY, "jobs/abc")
    stream = MarkerStream(ws, State.READY)
    assert h not in stream.next_batch(100)
    assert locate_key(ws, h.placement, h.key) is None
    stream.close()
    now[0] = 11.0
    stream = MarkerStream(ws, State.READY)
    assert h in stream.next_batch(100)
    assert locate_key(ws, h.placement, h.key) == h
    stream.close()
    ws.close()


class _StaleTimes(FileSystem):
    """Every read_bytes fails with ESTALE until `n` have failed; then reads succeed."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.opens = 0

    def read_bytes(self, path: str, limit: int) -> bytes:
        self.opens += 1
        if self.opens <= self.n:
            raise OSError(errno.ESTALE, os.strerror(errno.ESTALE), path)
        return super().read_bytes(path, limit)


@pytest.mark.parametrize("n", range(READ_ATTEMPTS))
def test_a_read_through_the_seam_retries_estale(tmp_path: Path, n: int) -> None:
    path = tmp_path / "job.json"
    path.write_bytes(b'{"a": 1}')
    model = _StaleTimes(n)
    set_filesystem(model)
    assert fs.read_bytes(str(path), 1024) == b'{"a": 1}'
    assert model.opens == n + 1


def test_estale_is_final_after_a_bounded_number_of_opens(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_bytes(b'{"a": 1}')
    model = _StaleTimes(1000)
    set_filesystem(model)
    with pytest.raises(OSError) as e:
        fs.read_bytes(str(path), 1024)
    assert e.value.errno == errno.ESTALE
    assert model.opens == READ_ATTEMPTS  # one loop: never attempts x attempts


def test_a_real_estale_open_is_retried_by_the_one_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "job.json"
    path.write_bytes(b'{"a": 1}')
    set_filesystem(FileSystem())
    real, opens = os.open, []

    def stale_open(*args: Any) -> int:
        opens.append(1)
        raise OSError(errno.ESTALE, os.strerror(errno.ESTALE))

    monkeypatch.setattr(os, "open", stale_open)
    with pytest.raises(OSError):
        fs.read_bytes(str(path), 1024)
    assert len(opens) == READ_ATTEMPTS
    monkeypatch.setattr(os, "open", real)
    assert fs.read_bytes(str(path), 1024) == b'{"a": 1}'
