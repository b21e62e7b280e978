"""The manager's hot path asks the filesystem for no more than it needs: a read sized to
the file, a missing state directory made before the rename into it (not after a rename
that failed), and fencing looked at on a clock rather than at every tick."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from httk_flow.errors import FlowError
from httk_flow.protocol import fsio
from httk_flow.protocol.frames import Body
from httk_flow.protocol.fsio import FileSystem, _read_to_end
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.transition import JobHandle, locate_key, transition
from httk_flow.protocol.workspace import Workspace


@settings(max_examples=200, deadline=None)
@given(
    content=st.binary(max_size=9000),
    limit=st.integers(min_value=0, max_value=10_000),
    told=st.integers(min_value=0, max_value=12_000),
)
def test_a_read_returns_what_a_read_of_the_whole_limit_would_whatever_size_it_was_told(
    tmp_path_factory: pytest.TempPathFactory, content: bytes, limit: int, told: int
) -> None:
    # `told` stands for an fstat taken before the file grew or shrank
    path = tmp_path_factory.mktemp("r") / "f"
    path.write_bytes(content)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert _read_to_end(fd, told, limit) == content[: limit + 1]
    finally:
        os.close(fd)


def test_read_bytes_still_refuses_a_file_over_its_limit(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_bytes(b"x" * 100)
    with pytest.raises(FlowError, match="larger than 99 bytes"):
        fsio.fs.read_bytes(str(path), 99)
    assert fsio.fs.read_bytes(str(path), 100) == b"x" * 100


class _Counting(FileSystem):
    """Plain operations, counting the renames that failed and the directories made."""

    def __init__(self) -> None:
        self.failed_renames = 0
        self.made: list[str] = []

    def rename(self, src: str, dst: str) -> None:
        try:
            super().rename(src, dst)
        except OSError:
            self.failed_renames += 1
            raise

    def makedirs(self, path: str) -> bool:
        self.made.append(path)
        return super().makedirs(path)


def _submitted(ws: Workspace, submitter: Submitter) -> JobHandle:
    [spec] = submitter.submit([SubmitRequest(program="true", placement="hot/one")])
    handle = locate_key(ws, spec.placement, spec.key)
    assert handle is not None
    return handle


def test_a_missing_state_directory_is_made_before_the_rename_and_then_trusted(
    ws: Workspace, submitter: Submitter
) -> None:
    job = _submitted(ws, submitter)
    target = ws.state_dir(State.READY, "hot/one")
    assert not os.path.exists(target)
    counting = _Counting()
    old = fsio.set_filesystem(counting)
    try:
        ready = transition(ws, job, State.READY, Body(), actor="a")
        assert counting.made == [target] and counting.failed_renames == 0
        # made by this process: known safe, no lstat next time
        assert ws.check_state_dir(target) is True
        claimed = transition(ws, ready, State.CLAIMED, Body(), actor="a")
        back = transition(ws, claimed, State.READY, Body(), actor="a")
    finally:
        fsio.set_filesystem(old)
    assert counting.failed_renames == 0
    assert counting.made == [target, ws.state_dir(State.CLAIMED, "hot/one")]
    assert os.path.isfile(back.path(ws))


def test_a_state_directory_made_by_someone_else_meanwhile_is_checked_whole(
    ws: Workspace, submitter: Submitter, tmp_path: Path
) -> None:
    job = _submitted(ws, submitter)
    outside = tmp_path / "outside"
    outside.mkdir()

    class _Planting(FileSystem):
        # between our look and our mkdir, another user plants a link out of the tree
        def makedirs(self, path: str) -> bool:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.symlink(outside, path)
            return super().makedirs(path)

    old = fsio.set_filesystem(_Planting())
    try:
        with pytest.raises(FlowError, match="leads out of the workspace's state tree"):
            transition(ws, job, State.READY, Body(), actor="a")
    finally:
        fsio.set_filesystem(old)
    assert os.listdir(outside) == []  # nothing was renamed through the link
    assert os.path.isfile(job.path(ws))  # and the job is where it was
