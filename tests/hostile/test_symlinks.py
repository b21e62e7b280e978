"""Symlinks where the protocol expects our own files and directories, each pointing at a
sentinel directory outside the workspace: nothing is followed out of the workspace, each
bad job fails with a reason (or is reported once), and one `flow run` serves the rest."""

from __future__ import annotations

import os
import shutil
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from manager.support import job, make_workspace, submit, write_script

from httk_flow.protocol.jobs import find_attempt_dir
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

from .support import HOSTILE, current, handle_of, handles, job_json, problems, run_scene, snapshot

#: outcome modes of HOSTILE that publish a symlink pointing into outside/<mode>/
OUTCOME_LINKS = {
    "ready_link": "not a directory",
    "json_link": "symbolic link",
    "children_link": "symbolic link",
}
CASES = (
    *OUTCOME_LINKS,
    "marker_link",
    "job_json_link",
    "attempt_dir_link",
    "attempts_link",
    "ready_placement_link",
    "final_placement_link",
)


@dataclass
class Scene:
    root: str
    outside: Path
    ids: dict[str, str]
    good: list[str]
    log: str
    rc: int
    before: dict[str, dict[str, tuple[int, int, bool]]] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)

    def untouched(self, case: str) -> None:
        now = snapshot(self.outside / case)
        assert now == self.before[case], f"outside/{case} changed: {self.before[case]} -> {now}"


def _decoy_outcome(d: Path) -> None:
    """What a followed link would find: an outcome that succeeds, and one child."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "outcome.json").write_text('{"action":"succeed","message":"OUTSIDE"}')
    (d / "children.jsonl").write_text('{"label":"outside"}\n')


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    base = tmp_path_factory.mktemp("symlinks")
    root = make_workspace(base / "ws")
    outside = base / "outside"
    for case in CASES:
        (outside / case).mkdir(parents=True)
    prog = write_script(base / "scripts", "hostile.sh", HOSTILE)
    good = submit(root, prog, count=4, params={"mode": "good"})
    ids: dict[str, str] = {}
    paths: dict[str, str] = {}
    for mode in OUTCOME_LINKS:
        _decoy_outcome(outside / mode)
        [ids[mode]] = submit(root, prog, params={"mode": mode, "out": str(outside / mode)})
    for case in ("marker_link", "job_json_link", "attempt_dir_link", "attempts_link"):
        [ids[case]] = submit(root, prog, params={"mode": "good"})
    [ids["final_placement_link"]] = submit(root, prog, placement="linked/final")
    ws = Workspace.open(root)
    try:
        # the marker itself: moved outside, a symlink left in its place
        h = handle_of(ws, ids["marker_link"])
        target = outside / "marker_link" / h.marker.name
        shutil.move(h.path(ws), target)
        os.symlink(target, h.path(ws))
        paths["marker_link"] = h.path(ws)
        # job.json: a symlink to a valid copy outside
        path = job_json(root, ws, ids["job_json_link"])
        copy = outside / "job_json_link" / "job.json"
        shutil.move(path, copy)
        path.symlink_to(copy)
        # the first attempt's directory, and the attempts/ directory of earlier protocol
        # revisions, link outside
        h = handle_of(ws, ids["attempt_dir_link"])
        (Path(ws.job_dir(h.placement, h.key)) / "a0001").symlink_to(outside / "attempt_dir_link")
        h = handle_of(ws, ids["attempts_link"])
        (Path(ws.job_dir(h.placement, h.key)) / "attempts").symlink_to(outside / "attempts_link")
        # a placement directory of the state tree: one where markers are found, one where
        # a job's marker is about to be renamed
        ready = Path(ws.state_dir(State.READY, "elsewhere"))
        ready.parent.mkdir(parents=True, exist_ok=True)
        ready.symlink_to(outside / "ready_placement_link")
        h = handle_of(ws, good[0])
        shutil.copy(h.path(ws), outside / "ready_placement_link" / h.marker.name)
        paths["ready_placement_link"] = str(ready)
        final = Path(ws.state_dir(State.SUCCEEDED, "linked/final"))
        final.parent.mkdir(parents=True)
        final.symlink_to(outside / "final_placement_link")
    finally:
        ws.close()
    before = {case: snapshot(outside / case) for case in CASES}
    rc, log = run_scene(base, root, 60)
    yield Scene(root, outside, ids, good, log, rc, before, paths)


def test_the_manager_served_everything_else(scene: Scene) -> None:
    assert "Traceback" not in scene.log, scene.log
    assert scene.rc in (0, 1), scene.log
    for jid in scene.good:
        assert job(scene.root, jid).state is State.SUCCEEDED, scene.log


@pytest.mark.parametrize("mode", sorted(OUTCOME_LINKS))
def test_a_symlinked_outcome_part_fails_the_job_unread(scene: Scene, mode: str) -> None:
    info = job(scene.root, scene.ids[mode])
    assert info.state is State.FAILED
    assert info.failure_code == "protocol_error"
    assert OUTCOME_LINKS[mode] in info.last["failure"]["message"]
    assert "OUTSIDE" not in str(info.frames), "the outcome outside was read"
    assert not [h for h in handles(scene.root) if h.placement.endswith(info.handle.key)]
    scene.untouched(mode)


def test_a_symlinked_marker_is_reported_once_and_not_followed(scene: Scene) -> None:
    reported = Counter(obj for obj, _ in problems(scene.log))
    assert reported[scene.paths["marker_link"]] == 1, scene.log
    assert os.path.islink(scene.paths["marker_link"])
    scene.untouched("marker_link")


def test_a_symlinked_job_json_fails_the_job_unread(scene: Scene) -> None:
    h, frame = current(scene.root, scene.ids["job_json_link"])
    assert h.state is State.FAILED
    assert "symbolic link" in frame["failure"]["message"]
    scene.untouched("job_json_link")


def test_a_symlinked_attempt_directory_fails_the_launch(scene: Scene) -> None:
    info = job(scene.root, scene.ids["attempt_dir_link"])
    assert info.state is State.FAILED
    assert info.failure_code == "launch_error"
    scene.untouched("attempt_dir_link")


def test_a_symlinked_attempts_directory_is_not_followed(scene: Scene) -> None:
    # attempts are made beside job.json (protocol revision 6): attempts/ is only read, and
    # never through a link
    scene.untouched("attempts_link")
    info = job(scene.root, scene.ids["attempts_link"])
    assert info.state is State.SUCCEEDED
    assert find_attempt_dir(str(info.job_dir(scene.root)), 1).endswith("/a0001")


def test_a_symlinked_state_placement_is_reported_once_and_not_walked(scene: Scene) -> None:
    reported = Counter(obj for obj, _ in problems(scene.log))
    assert reported[scene.paths["ready_placement_link"]] == 1, scene.log
    scene.untouched("ready_placement_link")


def test_a_symlinked_target_state_directory_receives_no_marker(scene: Scene) -> None:
    scene.untouched("final_placement_link")
