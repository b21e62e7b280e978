"""`flow fsck`: a clean workspace is clean; every injected inconsistency is found with its
kind; `--repair` fixes exactly the provably safe ones."""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from manager.support import Managers

from httk_flow import steering
from httk_flow.discovery import MarkerStream
from httk_flow.fsck import Fsck
from httk_flow.names import Marker, RecordRef
from httk_flow.states import State
from httk_flow.transition import locate_key
from httk_flow.workspace import Workspace

from .support import Flow

TWO_HOURS = 2 * 3600.0
NOT_A_MARKER = "is not a marker of the grammar (or not a file)"
HINT = "run `flow fsck --repair` to fix what is safe to fix"


@pytest.fixture
def jobs(flow: Flow, managers: Managers) -> dict[str, dict[str, str]]:
    """Four jobs j1..j4, run to success by `flow run`."""
    made = {t: flow.submit("--tag", t, "true") for t in ("j1", "j2", "j3", "j4")}
    assert managers.run(flow.root) == 0
    return made


def segments(root: str) -> list[Path]:
    return sorted((Path(root) / ".flow" / "journal").glob("*/*.jsonl"))


def ref_of(frames: list[dict[str, object]], to: str) -> str:
    """The record reference of a job's first frame into state `to` (the next frame's prev)."""
    i = next(i for i, f in enumerate(frames) if f["to"] == to)
    return str(frames[i + 1]["prev"])


def summary(flow: Flow, markers: int, payloads: int) -> str:
    n = len(segments(flow.root))
    return f"checked {markers} markers, {payloads} payloads, {n} journal segments"


def test_a_workspace_after_a_run_is_clean(flow: Flow, jobs: dict[str, dict[str, str]]) -> None:
    r = flow("fsck")
    assert (r.exit_code, r.output) == (0, summary(flow, 4, 4) + "\nclean\n")


def test_fsck_json_has_the_documented_shape(flow: Flow, jobs: dict[str, dict[str, str]]) -> None:
    assert flow.json("fsck") == {
        "clean": True,
        "markers": 4,
        "payloads": 4,
        "segments": len(segments(flow.root)),
        "problems": [],
    }
    shutil.rmtree(flow.job_dir(jobs["j2"]))
    doc = flow.json("fsck", code=1)
    assert doc["clean"] is False and (doc["markers"], doc["payloads"]) == (4, 3)
    [problem] = doc["problems"]
    assert problem == {
        "kind": "bad_payload",
        "object": f"job {jobs['j2']['key']}",
        "message": f"{flow.job_dir(jobs['j2'])}/job.json: is missing",
        "repaired": False,
    }


def test_every_injected_inconsistency_is_found_and_the_safe_ones_repaired(
    flow: Flow, jobs: dict[str, dict[str, str]]
) -> None:
    root = Path(flow.root)
    j1, j2, j3, j4 = (jobs[t] for t in ("j1", "j2", "j3", "j4"))
    old = time.time() - TWO_HOURS

    # an orphan payload: j1's marker is gone and its directory is two hours old
    flow.marker(j1).unlink()
    os.utime(flow.job_dir(j1), (old, old))
    # a marker without payload: j2's directory is gone
    shutil.rmtree(flow.job_dir(j2))
    # a duplicate marker: j3 also in ready, at the generation and frame it had there
    frames = flow.history(j3["key"])
    ready_gen = next(f["gen"] for f in frames if f["to"] == "ready")
    current = Marker.from_name(flow.marker(j3).name)
    dup = dataclasses.replace(
        current, generation=ready_gen, ref=RecordRef.parse(ref_of(frames, "ready"))
    )
    dup_path = root / ".flow" / "state" / "ready" / j3["placement"] / dup.name
    dup_path.parent.mkdir(parents=True, exist_ok=True)
    dup_path.write_bytes(b"")
    # an unreadable frame in the middle of a segment: j4's claimed frame, bytes kept in place
    claimed = RecordRef.parse(ref_of(flow.history(j4["key"]), "claimed"))
    seg = root / ".flow" / "journal" / claimed.writer / f"{claimed.segment}.jsonl"
    data = seg.read_bytes()
    end = data.index(b"\n", claimed.offset)
    assert claimed.offset > 0 and end + 1 < len(data), "the frame is in the middle"
    seg.write_bytes(data[: claimed.offset] + b"#" * (end - claimed.offset) + data[end:])
    # a file that is not a marker, and a symlink with a marker's name, in state directories
    j4_marker = flow.marker(j4)
    notes = j4_marker.parent / "notes.txt"
    notes.write_text("hello\n")
    link = root / ".flow" / "state" / "ready" / j4["placement"] / j4_marker.name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(j4_marker)
    # a stale temporary: a half-built payload two hours old
    tmp = root / ".flow" / "tmp" / "job-0123456789abcdef0123456789abcdef"
    tmp.mkdir()
    (tmp / "job.json").write_text("{}")
    os.utime(tmp, (old, old))

    orphan = f"orphan_payload: {flow.job_dir(j1)}: a job directory without a marker (2.0 h old)"
    duplicate = (
        f"duplicate_marker: job {j3['key']}: has 2 markers; generation {ready_gen} (ready) "
        f"is superseded by {current.generation} (succeeded)"
    )
    bad_notes = f"bad_entry: {notes}: {NOT_A_MARKER}"
    bad_link = f"bad_entry: {link}: {NOT_A_MARKER}"
    stale = f"stale_tmp: {tmp}: left by an interrupted operation"
    missing = f"bad_payload: job {j2['key']}: {flow.job_dir(j2)}/job.json: is missing"
    torn = f"unreadable_frame: {seg}: 1 frame(s) do not parse (first at byte {claimed.offset})"
    safe = [orphan, duplicate, bad_notes, bad_link, stale]
    unsafe = [missing, torn]

    r = flow("fsck")
    lines = r.output.splitlines()
    assert r.exit_code == 1, r.output
    # markers: j2, j3 twice, j4 (the symlink is none); payloads: the directories of j1 j3 j4
    assert lines[0] == summary(flow, 4, 3)
    assert sorted(lines[1:-1]) == sorted(f"problem: {p}" for p in safe + unsafe)
    assert lines[-1] == HINT

    r = flow("fsck", "--repair")
    lines = r.output.splitlines()
    assert r.exit_code == 1, r.output
    assert lines[0] == summary(flow, 4, 3)
    assert sorted(lines[1:]) == sorted(
        [f"repaired: {p}" for p in safe] + [f"problem: {p}" for p in unsafe]
    )
    lost = sorted(p.name.rsplit(".", 1)[0] for p in (root / ".flow" / "lost+found").iterdir())
    rel = [os.path.relpath(p, root).replace("/", "%") for p in (flow.job_dir(j1), dup_path)]
    rel += [os.path.relpath(p, root).replace("/", "%") for p in (notes, link)]
    assert lost == sorted(rel)
    assert not tmp.exists() and not link.is_symlink() and not dup_path.exists()
    assert flow.marker(j3).name == current.name and flow.marker(j4) == j4_marker

    r = flow("fsck")
    assert (r.exit_code, r.output) == (
        1,
        "\n".join([summary(flow, 3, 2), f"problem: {missing}", f"problem: {torn}", HINT]) + "\n",
    )


def test_repairing_only_safe_problems_leaves_a_clean_workspace(
    flow: Flow, jobs: dict[str, dict[str, str]]
) -> None:
    notes = flow.marker(jobs["j1"]).parent / "notes.txt"
    notes.write_text("hello\n")
    r = flow("fsck", "--repair")
    assert (r.exit_code, r.output) == (
        0,
        f"{summary(flow, 4, 4)}\nrepaired: bad_entry: {notes}: {NOT_A_MARKER}\n",
    )
    assert flow("fsck").output == summary(flow, 4, 4) + "\nclean\n"


def test_a_torn_last_frame_is_not_a_problem(flow: Flow, jobs: dict[str, dict[str, str]]) -> None:
    seg = max(segments(flow.root), key=lambda p: p.stat().st_size)
    with open(seg, "ab") as fh:
        fh.write(b'{"job": "half a fra')  # a writer killed mid-append
    assert flow("fsck").exit_code == 0


def test_a_young_orphan_payload_is_left_alone_as_a_submission_in_progress(
    flow: Flow, jobs: dict[str, dict[str, str]]
) -> None:
    flow.marker(jobs["j1"]).unlink()
    assert flow.json("fsck")["problems"] == []


def test_a_workspace_used_normally_is_still_clean_two_hours_later(
    flow: Flow, jobs: dict[str, dict[str, str]]
) -> None:
    flow.ok("status")
    flow.ok("managers")
    ws = Workspace.open(flow.root)
    try:
        report = Fsck(ws, repair=False, now=time.time() + TWO_HOURS).run()
    finally:
        ws.close()
    assert [p.to_json() for p in report.problems] == []


def fsck_while(
    root: str, after: State, move: Callable[[Workspace], None], *, repair: bool
) -> list[dict[str, object]]:
    """Run fsck; once it has walked the markers of state `after`, call `move(ws)` (another
    actor steering a job at that moment). Returns the problems found."""

    class Choreographed(MarkerStream):
        def close(self) -> None:
            super().close()
            if self.state is after and not done:
                done.append(True)
                other = Workspace.open(root)
                try:
                    move(other)
                finally:
                    other.close()

    done: list[bool] = []
    ws = Workspace.open(root)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("httk_flow.fsck.MarkerStream", Choreographed)
            report = Fsck(ws, repair=repair).run()
    finally:
        ws.close()
    assert done, f"fsck never walked {after.value}"
    return [p.to_json() for p in report.problems]


def test_repair_never_moves_the_payload_of_a_job_that_moved_during_the_walk(
    flow: Flow, managers: Managers
) -> None:
    job = flow.submit("--tag", "late", "--retries", "0", "false")
    assert managers.run(flow.root) == 1
    old = time.time() - TWO_HOURS
    os.utime(flow.job_dir(job), (old, old))  # a job submitted two hours ago

    def resume(ws: Workspace) -> None:
        h = locate_key(ws, job["placement"], job["key"])
        assert h is not None and h.state is State.FAILED
        steering.resume(ws, h)

    problems = fsck_while(flow.root, State.READY, resume, repair=True)
    assert flow.job_dir(job).is_dir(), "the payload of a live job was moved to lost+found"
    assert problems == []


def test_a_job_moving_during_the_walk_is_not_a_duplicate(flow: Flow, managers: Managers) -> None:
    job = flow.submit("--tag", "moving", "--pool", "elsewhere", "true")
    assert managers.run(flow.root) == 0  # registers it; nobody serves the pool
    assert flow.state("moving") == "ready"

    def pause(ws: Workspace) -> None:
        h = locate_key(ws, job["placement"], job["key"])
        assert h is not None
        steering.pause(ws, h)

    assert fsck_while(flow.root, State.READY, pause, repair=False) == []


def test_json_problems_name_kind_object_message_and_repaired(
    flow: Flow, jobs: dict[str, dict[str, str]]
) -> None:
    tmp = Path(flow.root) / ".flow" / "tmp" / "leftover"
    tmp.write_text("x")
    old = time.time() - TWO_HOURS
    os.utime(tmp, (old, old))
    doc = orjson.loads(flow("fsck", "--repair", "--json").stdout)
    assert doc["clean"] is True
    assert doc["problems"] == [
        {
            "kind": "stale_tmp",
            "object": str(tmp),
            "message": "left by an interrupted operation",
            "repaired": True,
        }
    ]


def test_repair_never_moves_a_state_directory_it_cannot_list(
    flow: Flow, jobs: dict[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    unreadable = flow.marker(jobs["j1"]).parent  # as if another user's, mode 0700
    real = os.scandir

    def scandir(path: str = ".") -> object:
        if os.fspath(path) == str(unreadable):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    r = flow("fsck", "--repair")
    problem = f"problem: bad_entry: {unreadable}: cannot be listed (Permission denied)"
    assert r.exit_code == 1 and problem in r.output.splitlines(), r.output
    assert unreadable.is_dir()
