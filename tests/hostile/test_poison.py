"""Single hostile inputs that stop a whole manager today (each in its own workspace, so the
scenes of test_malformed.py stay meaningful): one bad job must fail with a reason, or be
reported once, while the manager goes on serving the good jobs beside it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from manager.support import RUN_TIMEOUT, ManagerProcess, Managers, flow, job, submit, write_script

from httk_flow.errors import FlowError, InvalidOutcome
from httk_flow.protocol import outcome
from httk_flow.protocol.fsio import FileSystem
from httk_flow.protocol.names import Marker, RecordRef
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

from .support import (
    HOSTILE,
    current,
    handle_of,
    handles,
    job_json,
    plant_frame,
    problems,
    rename_marker,
)

GOOD = 3


def _bad_and_good(root: str, scripts: Path, **bad_fields: Any) -> tuple[str, list[str]]:
    """One job of HOSTILE with `bad_fields`, then GOOD good ones: their ids."""
    prog = write_script(scripts, "hostile.sh", HOSTILE)
    [bad] = submit(root, prog, **bad_fields)
    return bad, submit(root, prog, count=GOOD)


def _serve_one_bad_job(
    root: str, managers: Managers, bad: str, good: list[str], timeout: float = 60
) -> tuple[int | None, str]:
    """`flow run` over the workspace: (its exit status or None if it did not end, its log)."""
    p = managers.start(root, workers=2)
    try:
        rc: int | None = p.wait(timeout)
    except subprocess.TimeoutExpired:
        rc = None
    assert p.log is not None
    return rc, p.log.read_text(errors="replace")


def _assert_served(root: str, rc: int | None, log: str, bad: str, good: list[str]) -> None:
    assert rc is not None, f"flow run did not end:\n{log}"
    assert "Traceback" not in log, log
    for jid in good:
        assert job(root, jid).state is State.SUCCEEDED, log
    [h] = [h for h in handles(root) if h.job_id == bad]
    reported = [msg for obj, msg in problems(log) if bad in obj]
    assert h.state is State.FAILED or len(reported) == 1, (h, log)
    if h.state is State.FAILED:
        # only a failed job's frame is ours to read: a job left where it was still names
        # the damaged frame, which every reader refuses
        _, frame = current(root, bad)
        assert frame["failure"]["code"] == "protocol_error", frame


@pytest.mark.parametrize("mode", ["children_tag_int", "children_step_int"])
def test_a_child_line_with_a_non_string_tag_or_step_fails_its_parent(
    root: str, scripts: Path, managers: Managers, mode: str
) -> None:
    bad, good = _bad_and_good(root, scripts, params={"mode": mode})
    rc, log = _serve_one_bad_job(root, managers, bad, good)
    _assert_served(root, rc, log, bad, good)


def test_a_marker_naming_an_offset_past_2_63_fails_its_job(
    root: str, scripts: Path, managers: Managers
) -> None:
    bad, good = _bad_and_good(root, scripts)
    with contextlib.closing(Workspace.open(root)) as ws:
        h = handle_of(ws, bad)
        m = h.marker
        huge = RecordRef(m.ref.writer, m.ref.segment, 36**13 - 1)
        rename_marker(ws, h, Marker(m.key, m.priority, m.generation, huge))
    rc, log = _serve_one_bad_job(root, managers, bad, good)
    _assert_served(root, rc, log, bad, good)


#: frames a damaged or hostile journal may hold: (state the marker is put in, members)
MISTYPED_FRAMES = {
    "tries_text": (State.READY, {"tries": "x"}),
    "act_list": (State.READY, {"act": [1]}),
    "join_children_int": (
        State.WAITING,
        {"join": {"mode": "all_done", "next": "two", "act": 1, "children": 5}},
    ),
}


@pytest.mark.parametrize("case", sorted(MISTYPED_FRAMES))
def test_a_frame_with_mistyped_members_fails_only_its_job(
    root: str, scripts: Path, managers: Managers, case: str
) -> None:
    bad, good = _bad_and_good(root, scripts)
    state, members = MISTYPED_FRAMES[case]
    with contextlib.closing(Workspace.open(root)) as ws:
        plant_frame(ws, handle_of(ws, bad), state, **members)
    rc, log = _serve_one_bad_job(root, managers, bad, good)
    _assert_served(root, rc, log, bad, good)


def test_a_marker_name_with_leading_zeros_is_not_a_marker_and_is_left_for_fsck(
    root: str, scripts: Path, managers: Managers
) -> None:
    """One spelling per number: `g00` is not generation 0 but a name outside the grammar
    (two spellings of one marker would let a rename of the canonical name miss the file).
    It is reported once, never renamed or read, `flow fsck` names it, and the manager
    serves the other jobs and ends."""
    bad, good = _bad_and_good(root, scripts)
    with contextlib.closing(Workspace.open(root)) as ws:
        h = handle_of(ws, bad)
        path = h.path(ws)
        odd = path.replace(f".g{h.marker.generation}.", ".g00.")
        os.rename(path, odd)
    rc, log = _serve_one_bad_job(root, managers, bad, good)
    assert rc is not None, f"flow run did not end:\n{log}"
    assert "Traceback" not in log, log
    for jid in good:
        assert job(root, jid).state is State.SUCCEEDED, log
    reported = [msg for obj, msg in problems(log) if obj == odd]
    assert len(reported) == 1 and "grammar" in reported[0], log
    assert os.path.isfile(odd) and not os.path.islink(odd)
    assert bad not in {h.job_id for h in handles(root)}
    check = flow("fsck", "-w", root)
    assert check.returncode != 0
    assert os.path.basename(odd) in check.stdout + check.stderr, check.stdout + check.stderr


def _unblock(fifo: Path) -> None:
    """Open a FIFO for writing and close it: a reader blocked in open() gets EOF."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_a_fifo_in_place_of_job_json_fails_its_job(
    root: str, scripts: Path, managers: Managers
) -> None:
    bad, good = _bad_and_good(root, scripts)
    with contextlib.closing(Workspace.open(root)) as ws:
        fifo = job_json(root, ws, bad)
    fifo.unlink()
    os.mkfifo(fifo)
    p: ManagerProcess = managers.start(root, workers=2)
    try:
        # a manager stuck in open() of the FIFO waits forever: a run that has not ended
        # within RUN_TIMEOUT is stuck, one that is merely slow on a busy machine is not
        ended = p.wait(RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        ended = None
    finally:
        _unblock(fifo)  # let a blocked manager go on, so that it can be stopped cleanly
    assert ended is not None, "the manager is stuck opening the FIFO"
    assert p.log is not None
    _assert_served(root, ended, p.log.read_text(), bad, good)


def test_a_fifo_in_place_of_outcome_json_is_refused_at_once(tmp_path: Path) -> None:
    ready = tmp_path / "a0001" / outcome.OUTCOME_DIR
    ready.mkdir(parents=True)
    os.mkfifo(ready / "outcome.json")
    result: list[object] = []

    def read() -> None:
        try:
            result.append(outcome.read_outcome(str(ready.parent)))
        except FlowError as e:
            result.append(e)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(2)
    blocked = t.is_alive()
    while t.is_alive():
        _unblock(ready / "outcome.json")
        t.join(0.1)
    assert not blocked, "read_outcome blocked in open() on a FIFO"
    assert isinstance(result[0], InvalidOutcome)


def test_a_fifo_is_refused_once_opened(tmp_path: Path) -> None:
    """Once open() returns (a writer came), the FIFO is refused as not a regular file."""
    fifo = tmp_path / "job.json"
    os.mkfifo(fifo)
    done: list[BaseException] = []

    def read() -> None:
        try:
            FileSystem().read_bytes(str(fifo), 1024)
        except BaseException as e:
            done.append(e)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    deadline = time.monotonic() + 5
    while t.is_alive() and time.monotonic() < deadline:
        _unblock(fifo)
        t.join(0.05)
    assert not t.is_alive()
    assert isinstance(done[0], FlowError) and "regular file" in str(done[0])
