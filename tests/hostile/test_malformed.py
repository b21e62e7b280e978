"""Malformed and oversized job.json, outcome.json, journal frames and marker names, all in
one workspace served by one `flow run`: each bad job fails with a reason (or is reported
once), and the good jobs beside them succeed."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from manager.support import JobInfo, dump, job, make_workspace, submit, write_script

from httk_flow.protocol.names import Marker, RecordRef, new_id
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

from .support import (
    HOSTILE,
    current,
    handle_of,
    handles,
    job_json,
    problems,
    rename_marker,
    run_scene,
    segment_path,
)

#: job.json replaced after submission: how, and a word the failure message must contain
JOB_JSON_CASES = {
    "garbage": (b"\x00\xffnot json{", "not valid JSON"),
    "empty": (b"", "not valid JSON"),
    "oversized": (orjson.dumps({"pad": "x" * 2_000_000}), "larger than"),
    "deep": (b"[" * 100_000, "not valid JSON"),
    "not_object": (b"[1, 2, 3]", "not a JSON object"),
    "wrong_types": (None, "retries"),  # the real one with "retries": "many"
    "other_job": (None, "does not match"),  # a good job's job.json
    "missing": (None, "missing"),
    "directory": (None, "not a regular file"),
}

#: what the first attempt publishes (HOSTILE modes), and a word of the failure message
OUTCOME_CASES = {
    "garbage": "not valid JSON",
    "big": "larger than",
    "action_int": "action",
    "step_int": "step",
    "code_list": "code",
    "message_obj": "message",
    "join_bad": "join",
    "no_json": "no outcome.json",
    "ready_file": "not a directory",
    "duplicate": "more than one outcome",
    "children_garbage": "not valid JSON",
    "children_none": "no children",
    "children_dup": "used twice",
}

#: journal damage under one job of three submitted together (its frame is mid-segment)
JOURNAL_CASES = (
    "frame_garbage",
    "frame_joined",
    "frame_array",
    "missing_segment",
    "offset_past_end",
    "offset_mid_line",
)

#: names planted in state directories that are not markers of the grammar
PLANTED = (
    "junk",
    "README.txt",
    f"{'A' * 32}.p500.g0.w-0-0",
    f"{new_id()}.p500.g0.w-0-0.extra",
    f"{new_id()}.p5000.g0.w-0-0",
    f"{new_id()}.p500.g0.W-0-0",
    f"{new_id()}.p500.g0",
    "fifo",
)


@dataclass
class Scene:
    root: str
    ids: dict[str, str]
    good: list[str]
    neighbours: list[str]
    rc: int
    log: str
    planted: list[str]

    def info(self, case: str) -> JobInfo:
        return job(self.root, self.ids[case])


def _damage_job_json(path: Path, case: str, good: Path) -> None:
    raw, _ = JOB_JSON_CASES[case]
    if raw is not None:
        path.write_bytes(raw)
    elif case == "wrong_types":
        d = orjson.loads(path.read_bytes())
        d["retries"] = "many"
        path.write_bytes(orjson.dumps(d))
    elif case == "other_job":
        path.write_bytes(good.read_bytes())
    elif case == "missing":
        path.unlink()
    elif case == "directory":
        path.unlink()
        path.mkdir()


def _damage_journal(ws: Workspace, case: str, job_id: str) -> None:
    h = handle_of(ws, job_id)
    seg = segment_path(ws, h.marker.ref)
    data = bytearray(Path(seg).read_bytes())
    off = h.marker.ref.offset
    end = data.index(b"\n", off)
    assert off > 0 and end + 1 < len(data), "the damaged frame must be mid-segment"
    if case == "frame_garbage":
        data[off:end] = b"\x00\xff" + b"#" * (end - off - 2)
    elif case == "frame_joined":
        data[end] = ord(" ")  # this frame and the next one become one line
    elif case == "frame_array":
        data[off:end] = b"[" + b" " * (end - off - 2) + b"]"
    if case.startswith("frame_"):
        Path(seg).write_bytes(bytes(data))
        return
    m = h.marker
    ref = {
        "missing_segment": RecordRef(m.ref.writer, 7, 0),
        "offset_past_end": RecordRef(m.ref.writer, m.ref.segment, len(data) + 100),
        "offset_mid_line": RecordRef(m.ref.writer, m.ref.segment, off + 5),
    }[case]
    rename_marker(ws, h, Marker(m.key, m.priority, m.generation, ref))


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    base = tmp_path_factory.mktemp("malformed")
    root = make_workspace(base / "ws")
    prog = write_script(base / "scripts", "hostile.sh", HOSTILE)
    good = submit(root, prog, count=4, params={"mode": "good"})
    ids: dict[str, str] = {}
    for case in JOB_JSON_CASES:
        [ids[f"job_{case}"]] = submit(root, prog, tag=f"job-{case.replace('_', '-')}")
    for case in OUTCOME_CASES:
        tag = f"out-{case.replace('_', '-')}"
        [ids[f"out_{case}"]] = submit(root, prog, tag=tag, params={"mode": case})
    neighbours: list[str] = []
    for case in JOURNAL_CASES:
        before, bad, after = submit(root, prog, count=3)
        ids[f"jnl_{case}"] = bad
        neighbours += [before, after]
    ws = Workspace.open(root)
    try:
        good_json = job_json(root, ws, good[0])
        for case in JOB_JSON_CASES:
            _damage_job_json(job_json(root, ws, ids[f"job_{case}"]), case, good_json)
        for case in JOURNAL_CASES:
            _damage_journal(ws, case, ids[f"jnl_{case}"])
        planted = []
        for st in (State.SUBMITTED, State.READY, State.RUNNING):
            d = Path(ws.state_dir(st, "jobs/abc"))
            d.mkdir(parents=True, exist_ok=True)
            for name in PLANTED:
                p = d / name
                if name == "fifo":
                    os.mkfifo(p)
                else:
                    p.write_bytes(b"")
                planted.append(str(p))
            # a directory with a marker's name is a placement component, walked into
            (d / f"{new_id()}.p500.g0.w-0-0").mkdir()
        # a marker of the grammar with neither payload nor frame
        orphan = Marker(new_id(), 500, 0, RecordRef("nosuchwriter", 0, 0))
        d = Path(ws.state_dir(State.SUBMITTED, "jobs/orphan"))
        d.mkdir(parents=True)
        (d / orphan.name).write_bytes(b"")
        ids["orphan_marker"] = orphan.key
    finally:
        ws.close()
    rc, log = run_scene(base, root, 120)
    yield Scene(root, ids, good, neighbours, rc, log, planted)


def test_the_manager_ran_to_the_end_without_a_crash(scene: Scene) -> None:
    assert "Traceback" not in scene.log, scene.log
    assert scene.rc in (0, 1), scene.log  # 1: some job it ran failed


def test_good_jobs_and_the_neighbours_of_damaged_frames_succeed(scene: Scene) -> None:
    for jid in [*scene.good, *scene.neighbours]:
        assert job(scene.root, jid).state is State.SUCCEEDED, dump(scene.root)


def _failed_with(info: JobInfo, word: str, code: str = "protocol_error") -> None:
    assert info.state is State.FAILED, f"{info.handle.key}: {info.state}"
    assert info.failure_code == code, info.last
    assert word.lower() in info.last["failure"]["message"].lower(), info.last["failure"]


@pytest.mark.parametrize("case", sorted(JOB_JSON_CASES))
def test_a_bad_job_json_fails_its_job_with_the_reason(scene: Scene, case: str) -> None:
    info = scene.info(f"job_{case}")
    _failed_with(info, JOB_JSON_CASES[case][1])
    assert "job.json" in info.last["failure"]["message"]
    assert not info.attempts, "a job with a bad definition never runs"
    # said once by the manager (under --quiet too), with the reason the frame records
    said = [msg for obj, msg in problems(scene.log) if obj == info.handle.key]
    assert said == [f"failed at registration: {info.last['failure']['message']}"], scene.log


@pytest.mark.parametrize("case", sorted(OUTCOME_CASES))
def test_a_bad_outcome_fails_its_job_with_the_reason(scene: Scene, case: str) -> None:
    info = scene.info(f"out_{case}")
    _failed_with(info, OUTCOME_CASES[case])
    assert len(info.attempts) == 1, "a protocol error is not retried"


@pytest.mark.parametrize("case", JOURNAL_CASES)
def test_a_damaged_frame_fails_only_the_job_it_belongs_to(scene: Scene, case: str) -> None:
    # its history is unreadable past the damage: read the frame its marker names
    h, frame = current(scene.root, scene.ids[f"jnl_{case}"])
    assert h.state is State.FAILED, frame
    assert frame["failure"]["code"] == "protocol_error"
    assert "journal" in frame["failure"]["message"], frame


def test_a_marker_without_payload_or_frame_fails(scene: Scene) -> None:
    h, frame = current(scene.root, scene.ids["orphan_marker"])
    assert h.state is State.FAILED
    assert frame["failure"]["code"] == "protocol_error"
    assert "journal" in frame["failure"]["message"]


def test_names_not_of_the_grammar_are_reported_once_and_left_alone(scene: Scene) -> None:
    reported = Counter(obj for obj, _ in problems(scene.log))
    for path in scene.planted:
        assert os.path.lexists(path), f"{path} was removed"
        assert reported[path] == 1, f"{path} reported {reported[path]} times:\n{scene.log}"
    planted = set(scene.planted)
    assert all("not a marker" in msg for obj, msg in problems(scene.log) if obj in planted)


def test_every_job_holds_exactly_one_marker(scene: Scene) -> None:
    found = handles(scene.root)
    keys = Counter(h.key for h in found)
    assert keys and max(keys.values()) == 1
    assert not [h for h in found if h.state.is_active], found
