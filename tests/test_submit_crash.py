"""A submitter killed at any moment leaves only whole jobs visible: no marker without payload."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import markers_in, wait_for

from httk_flow.protocol import jobs
from httk_flow.protocol.crash import POINTS
from httk_flow.protocol.jobspec import JobSpec
from httk_flow.protocol.names import Marker
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

JOBS = 300
CHUNK = 50  # jobs per submit() call, so the per-batch crash points are hit several times
SUBMIT_POINTS = [p for p in POINTS if p.startswith("submit.")]
INPUT_TEXT = "input of the crash test\n" * 50

#: one submitter: open the workspace, say so, then submit JOBS jobs with a program and an input
SUBMITTER = textwrap.dedent(
    f"""
    import sys
    from httk_flow.protocol.submit import SubmitRequest, Submitter
    from httk_flow.protocol.workspace import Workspace

    root, program, data, started = sys.argv[1:5]
    sub = Submitter(Workspace.open(root), actor="crasher")
    open(started, "w").close()
    reqs = [
        SubmitRequest(
            program=program,
            inputs=[data],
            params={{"i": i}},
            placement=None if i % 2 else f"crash/{{i % 3}}",
        )
        for i in range({JOBS})
    ]
    for start in range(0, {JOBS}, {CHUNK}):
        list(sub.submit(reqs[start : start + {CHUNK}]))
    """
)


@pytest.fixture
def crash_ws(tmp_path: Path) -> tuple[Workspace, str, str]:
    ws = Workspace.create(str(tmp_path / "ws"))
    program = tmp_path / "prog.sh"
    program.write_text("#!/bin/sh\ntrue\n")
    program.chmod(0o755)
    data = tmp_path / "input.txt"
    data.write_text(INPUT_TEXT)
    return ws, str(program), str(data)


def _start(
    ws: Workspace, program: str, data: str, started: Path, crash_at: str | None = None
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "FLOW_CRASH_AT"}
    if crash_at:
        env["FLOW_CRASH_AT"] = crash_at
    return subprocess.Popen(
        [sys.executable, "-c", SUBMITTER, ws.root, program, data, str(started)],
        env=env,
        stderr=subprocess.PIPE,
    )


def _check_every_visible_job_is_whole(ws: Workspace, checked: set[str] | None = None) -> int:
    """Every marker has a parsable job.json, its input, its program and a readable frame.

    Keys in `checked` passed before (a submitted marker never changes) and are skipped.
    """
    reader = Workspace.open(ws.root)  # a fresh process's view
    seen: set[str] = set()
    for rel in markers_in(reader, State.SUBMITTED):
        placement, name = rel.rsplit("/", 1)
        marker = Marker.from_name(name)
        assert marker.key not in seen, f"two markers for {marker.key}"
        seen.add(marker.key)
        if checked is not None:
            if marker.key in checked:
                continue
            checked.add(marker.key)
        job_dir = reader.job_dir(placement, marker.key)
        with open(os.path.join(job_dir, "job.json"), "rb") as fh:
            spec = JobSpec.from_json(fh.read(), rel)
        assert spec == jobs.load_spec(reader, placement, marker.key)
        assert Path(job_dir, "files", "input.txt").read_text() == INPUT_TEXT
        assert spec.program.digest is not None
        assert os.access(reader.program_path(spec.program.digest), os.X_OK)
        frame = reader.reader.read(marker.ref)
        assert (frame["job"], frame["key"], frame["placement"]) == (spec.id, spec.key, placement)
        assert (frame["to"], frame["gen"], frame["prev"]) == ("submitted", 0, None)
    for kind in State:
        if kind is not State.SUBMITTED:
            assert markers_in(reader, kind) == []
    reader.close()
    return len(seen)


def _register_everything(ws: Workspace) -> None:
    """Survivors are ordinary jobs: every one registers, none fails as a protocol error."""
    for job in list(jobs.all_jobs(ws, (State.SUBMITTED,))):
        assert jobs.register(ws, job, actor="check").state is State.READY


@pytest.mark.slow
def test_a_submitter_killed_at_random_times_leaves_no_marker_without_its_payload(
    crash_ws: tuple[Workspace, str, str], tmp_path: Path
) -> None:
    ws, program, data = crash_ws
    # a clean run first: it finishes, and times the submission to aim the kills
    started = tmp_path / "started-clean"
    proc = _start(ws, program, data, started)
    wait_for(started.exists, timeout=30)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=60)
    window = time.monotonic() - t0
    assert proc.returncode == 0, err.decode()
    assert _check_every_visible_job_is_whole(ws) == JOBS

    rng = random.Random(20240611)
    visible, checked = JOBS, set[str]()
    for round_ in range(12):
        started = tmp_path / f"started-{round_}"
        proc = _start(ws, program, data, started)
        wait_for(started.exists, timeout=30)
        try:
            proc.wait(timeout=rng.uniform(0, window * 1.1))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        now = _check_every_visible_job_is_whole(ws, checked)
        assert visible <= now <= visible + JOBS
        visible = now
    assert _check_every_visible_job_is_whole(ws) == visible
    _register_everything(ws)


@pytest.mark.slow
@pytest.mark.parametrize("nth", [1, 2, 5])
@pytest.mark.parametrize("point", SUBMIT_POINTS)
def test_a_submitter_killed_at_each_crash_point_leaves_no_marker_without_its_payload(
    crash_ws: tuple[Workspace, str, str], tmp_path: Path, point: str, nth: int
) -> None:
    ws, program, data = crash_ws
    proc = _start(ws, program, data, tmp_path / "started", crash_at=f"{point}:{nth}")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err.decode()  # it reached the point and died
    visible = _check_every_visible_job_is_whole(ws)
    if point == "submit.after_payload":
        # died after its nth payload: all of them orphans, since no frame or marker names them
        assert (_payloads(ws), visible) == (nth, 0)
    else:
        # died after the nth batch's frames: that batch's payloads are not published yet
        assert (_payloads(ws), visible) == (CHUNK * (nth - 1), CHUNK * (nth - 1))
    # the workspace takes new work after the crash, and every visible job registers
    proc = _start(ws, program, data, tmp_path / "started-after")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert _check_every_visible_job_is_whole(ws) == visible + JOBS
    _register_everything(ws)


def _payloads(ws: Workspace) -> int:
    """Published job directories, with or without a marker."""
    return sum(
        "job.json" in files
        for d, _, files in os.walk(ws.root)
        if not os.path.relpath(d, ws.root).startswith(".flow")
    )
