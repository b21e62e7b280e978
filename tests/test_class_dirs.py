"""The ready markers of a service class lie in its class directory (policy `class_dirs`,
protocol revision 8): a manager passes by another pool's backlog without listing it, every
reader finds them, a workspace made with --no-class-dirs keeps the flat layout, and a
marker outside its directory is reported, passed by, and put back by `flow fsck --repair`."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from helpers import manager_in_this_process, markers_in

from httk_flow.manager.config import ManagerConfig
from httk_flow.manager.loop import Manager
from httk_flow.protocol import fsio
from httk_flow.protocol import transition as transition_module
from httk_flow.protocol.frames import Body
from httk_flow.protocol.fsio import FileSystem
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.transition import locate_key, transition
from httk_flow.protocol.workspace import Workspace

FLOW = [sys.executable, "-m", "httk_flow"]


def flow(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FLOW, *args], capture_output=True, text=True, timeout=120)


def ok(*args: str) -> str:
    r = flow(*args)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


def _workspace(tmp_path: Path, *init: str) -> str:
    root = str(tmp_path / "ws")
    ok("init", root, *init)
    ok("-w", root, "submit", "--pool", "A", "--array", "1-4", "/bin/true")
    ok("-w", root, "submit", "--pool", "B", "--tag", "bee", "--array", "1-6", "/bin/true")
    ok("-w", root, "submit", "--array", "1-2", "/bin/true")
    ok("-w", root, "run", "--pool", "none", "--idle", "0", "--quiet")  # registers only
    return root


def _class_of(root: str, pool: str) -> str:
    for name in os.listdir(os.path.join(root, ".flow", "classes")):
        doc = orjson.loads(Path(root, ".flow", "classes", name).read_bytes())
        if doc.get("pool") == pool:
            return name.removesuffix(".json")
    raise AssertionError(f"no class of pool {pool}")


def _states(root: str) -> dict[str, int]:
    doc = orjson.loads(ok("-w", root, "status", "--json"))
    return {k: v for k, v in doc["counts"].items() if v}


def test_a_ready_job_of_a_class_lies_in_its_class_directory_and_every_other_marker_does_not(
    tmp_path: Path,
) -> None:
    root = _workspace(tmp_path)
    policy = orjson.loads(Path(root, ".flow", "format.json").read_bytes())["policy"]
    assert policy["class_dirs"] is True
    a, b = _class_of(root, "A"), _class_of(root, "B")
    ws = Workspace.open(root)
    ready = markers_in(ws, State.READY)
    # default-class jobs lie in their shard (jobs/xx), the others one level down
    assert sum(1 for p in ready if f"/@{a}/" in p) == 4
    assert sum(1 for p in ready if f"/@{b}/" in p) == 6
    assert sum(1 for p in ready if "/@" not in p) == 2
    assert _states(root) == {"ready": 12}
    # one job of pool B, found by every reader: list, show, cancel
    listed = ok("-w", root, "list", "--tag", "bee", "--state", "ready", "--format", "fullid")
    idents = listed.split()[1:]
    assert len(idents) == 6
    assert "ready" in ok("-w", root, "show", idents[0])
    ident = idents[0]
    ok("-w", root, "cancel", ident)
    assert _states(root) == {"ready": 11, "cancelled": 1}
    # a manager of pool A runs its four; what it leaves is B's
    ok("-w", root, "run", "--pool", "A", "--idle", "0", "--quiet")
    assert _states(root) == {"ready": 7, "succeeded": 4, "cancelled": 1}
    ok("-w", root, "run", "--pool", "B", "--idle", "0", "--quiet")
    ok("-w", root, "run", "--idle", "0", "--quiet")
    assert _states(root) == {"succeeded": 11, "cancelled": 1}
    # no marker of another state ever lay in a class directory
    for st in State:
        if st is not State.READY:
            assert not [p for p in markers_in(ws, st) if "/@" in p], st
    fsck = orjson.loads(ok("-w", root, "fsck", "--json"))
    assert fsck["problems"] == []
    ws.close()


def test_no_class_dirs_keeps_every_ready_marker_in_its_placements_directory(
    tmp_path: Path,
) -> None:
    root = _workspace(tmp_path, "--no-class-dirs")
    # a reader of protocol revision 7 refuses an unknown policy key: none is written
    policy = orjson.loads(Path(root, ".flow", "format.json").read_bytes())["policy"]
    assert "class_dirs" not in policy
    ws = Workspace.open(root)
    assert ws.class_dirs is False
    ready = markers_in(ws, State.READY)
    assert len(ready) == 12 and not [p for p in ready if "/@" in p]
    ok("-w", root, "run", "--pool", "A", "--idle", "0", "--quiet")
    assert _states(root) == {"ready": 8, "succeeded": 4}
    ws.close()


class _Listings(FileSystem):
    """Plain operations, recording every directory listed."""

    def __init__(self) -> None:
        self.listed: list[str] = []
        self.lock = threading.Lock()

    def scandir(self, path: str) -> Iterator[os.DirEntry[str]]:
        with self.lock:
            self.listed.append(path)
        return super().scandir(path)


def test_a_manager_never_lists_the_class_directory_of_a_pool_it_does_not_serve(
    tmp_path: Path,
) -> None:
    root = _workspace(tmp_path)
    b = _class_of(root, "B")
    ws = Workspace.open(root)
    # a filesystem of its own: every listing (the claim stream's, the idle check's, the
    # stop's look at what is left) goes through it, none by name alone
    listings = _Listings()
    old = fsio.set_filesystem(listings)
    try:
        manager = Manager(
            ws,
            ManagerConfig(
                workers=2, pools=("A",), exit_when_idle=0, poll_interval=0.05, verbose=False
            ),
        )
        with manager_in_this_process():
            assert manager.run(install_signals=False) == 0
    finally:
        fsio.set_filesystem(old)
    assert manager.succeeded == 4
    assert any("/@" in p for p in listings.listed)  # its own class's directories
    assert not [p for p in listings.listed if f"/@{b}" in p]
    ws.close()
    assert _states(root) == {"ready": 8, "succeeded": 4}


def test_a_marker_outside_its_class_directory_is_reported_passed_by_and_put_back(
    tmp_path: Path,
) -> None:
    root = _workspace(tmp_path)
    b = _class_of(root, "B")
    ws = Workspace.open(root)
    [first, *_] = sorted(p for p in markers_in(ws, State.READY) if f"/@{b}/" in p)
    src = os.path.join(ws.state_dir(State.READY), first)
    dst = os.path.join(os.path.dirname(os.path.dirname(src)), os.path.basename(src))
    os.rename(src, dst)  # by hand, one level up: where revision 7 placed it
    fsck = orjson.loads(flow("-w", root, "fsck", "--json").stdout)
    [problem] = fsck["problems"]
    assert problem["kind"] == "misplaced_marker" and not problem["repaired"]
    assert dst in problem["message"]
    # no manager can move it: it is reported and passed by, and the others run
    r = flow("-w", root, "run", "--pool", "B", "--idle", "0")
    assert "lies outside the directory its state and class place it in" in r.stderr
    # B's five ran; A's four, the default's two and the misplaced one are left
    assert _states(root) == {"ready": 7, "succeeded": 5}
    fsck = orjson.loads(flow("-w", root, "fsck", "--repair", "--json").stdout)
    [problem] = fsck["problems"]
    assert problem["kind"] == "misplaced_marker" and problem["repaired"]
    assert os.path.isfile(src) and not os.path.exists(dst)
    for pool in ("A", "B", "default"):
        ok("-w", root, "run", "--pool", pool, "--idle", "0", "--quiet")
    assert _states(root) == {"succeeded": 12}
    assert orjson.loads(ok("-w", root, "fsck", "--json"))["problems"] == []
    ws.close()


def _recording_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The directories transitions fsync from now on, in order (each fsync still made)."""
    synced: list[str] = []
    real = transition_module.fsync_dir

    def fsync_dir(path: str) -> None:
        synced.append(path)
        real(path)

    monkeypatch.setattr(transition_module, "fsync_dir", fsync_dir)
    return synced


def test_durable_the_directories_made_for_a_rename_are_made_durable_in_their_parents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A class directory (and a shard) made for a marker's rename is an entry of its
    parent: in durable mode each parent up to the state kind is fsynced, so a power loss
    cannot take the directory, and the marker in it, away."""
    ws = Workspace.create(str(tmp_path / "ws"), durable=True)
    [spec] = Submitter(ws, actor="t").submit([SubmitRequest(program="true", pool="B")])
    job = locate_key(ws, spec.placement, spec.key)
    assert job is not None and job.state is State.SUBMITTED
    synced = _recording_fsyncs(monkeypatch)
    ready = transition(ws, job, State.READY, Body(), actor="t")
    made = os.path.dirname(ready.path(ws))
    assert os.path.basename(made).startswith("@")
    shard = ws.state_dir(State.READY, spec.placement)
    for d in (made, shard, os.path.dirname(shard), ws.state_dir(State.READY)):
        assert d in synced, (d, synced)
    assert ws.state_root not in synced  # the kinds are made once, by `flow init`
    synced.clear()
    claimed = transition(ws, ready, State.CLAIMED, Body(), actor="t")
    transition(ws, claimed, State.READY, Body(), actor="t")
    assert shard not in synced  # made once: only the directories renamed in and out
    ws.close()


def _astray_job(tmp_path: Path) -> tuple[str, str, str]:
    """A workspace of one registered job of pool B whose ready marker was moved by hand out
    of its class directory: (root, where it lies, where it belongs)."""
    root = str(tmp_path / "ws")
    ok("init", root)
    ok("-w", root, "submit", "--pool", "B", "/bin/true")
    ok("-w", root, "run", "--pool", "none", "--idle", "0", "--quiet")
    ws = Workspace.open(root)
    [rel] = markers_in(ws, State.READY)
    right = os.path.join(ws.state_dir(State.READY), rel)
    wrong = os.path.join(os.path.dirname(os.path.dirname(right)), os.path.basename(right))
    os.rename(right, wrong)
    ws.close()
    return root, wrong, right


def test_gc_keeps_the_history_of_a_job_whose_marker_is_misplaced(tmp_path: Path) -> None:
    """No lookup finds a misplaced marker, but its job's journal segments stay: gc walks
    it as any other, says so, and leaves its streamed output alone."""
    root, wrong, right = _astray_job(tmp_path)
    old = 1_000_000_000.0  # 2001: older than any retention
    for d, _, files in os.walk(os.path.join(root, ".flow", "journal")):
        for f in files:
            os.utime(os.path.join(d, f), (old, old))
    r = flow("-w", root, "gc", "--json")
    assert r.returncode == 0, r.stderr
    doc = orjson.loads(r.stdout)
    assert doc["misplaced"] == 1
    assert not [i for i in doc["collected"] if i["kind"] == "journal_segment"], doc
    r = flow("-w", root, "gc")
    assert "1 marker(s) lie outside the directory their class places them in" in r.stderr
    assert "flow fsck --repair" in r.stderr
    fsck = orjson.loads(flow("-w", root, "fsck", "--repair", "--json").stdout)
    assert [(p["kind"], p["repaired"]) for p in fsck["problems"]] == [("misplaced_marker", True)]
    assert os.path.isfile(right) and not os.path.exists(wrong)
    ok("-w", root, "run", "--pool", "B", "--idle", "0", "--quiet")
    assert _states(root) == {"succeeded": 1}


def test_fsck_sets_a_stale_misplaced_copy_aside_and_never_makes_it_claimable(
    tmp_path: Path,
) -> None:
    """A copy of a finished job's old ready marker, left where revision 7 placed it: it is
    superseded, so --repair sets it aside (lost+found), never into the class directory
    where a manager would claim it and run the job again."""
    root, wrong, right = _astray_job(tmp_path)
    os.rename(wrong, right)
    stale = Path(wrong)
    stale.write_bytes(b"")  # the copy, beside the job's real marker
    ok("-w", root, "run", "--pool", "B", "--idle", "0", "--quiet")
    assert stale.exists()
    fsck = orjson.loads(flow("-w", root, "fsck", "--json").stdout)
    [problem] = fsck["problems"]
    assert (
        problem["kind"] == "misplaced_marker" and "superseded by generation" in problem["message"]
    )
    fsck = orjson.loads(flow("-w", root, "fsck", "--repair", "--json").stdout)
    [problem] = fsck["problems"]
    assert problem["repaired"] and not stale.exists() and not os.path.exists(right)
    assert os.listdir(os.path.join(root, ".flow", "lost+found"))
    ok("-w", root, "run", "--pool", "B", "--idle", "0", "--quiet")
    assert _states(root) == {"succeeded": 1}
    assert orjson.loads(ok("-w", root, "fsck", "--json"))["problems"] == []


def test_a_directory_inside_a_class_directory_is_a_bad_entry_not_a_placement(
    tmp_path: Path,
) -> None:
    root, wrong, right = _astray_job(tmp_path)
    os.rename(wrong, right)
    odd = Path(os.path.dirname(right), "sub")
    odd.mkdir()
    fsck = orjson.loads(flow("-w", root, "fsck", "--repair", "--json").stdout)
    [problem] = fsck["problems"]
    assert problem["kind"] == "bad_entry" and problem["object"] == str(odd)
    assert "inside a class directory" in problem["message"] and not problem["repaired"]
    ok("-w", root, "run", "--pool", "B", "--idle", "0", "--quiet")
    assert _states(root) == {"succeeded": 1}


def test_durable_a_directory_made_again_after_its_retirement_is_made_durable_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directory is known to this process, then retired by another actor (§1): the
    rename that finds it gone makes it again, and fsyncs its parents as the first did."""
    ws = Workspace.create(str(tmp_path / "ws"), durable=True)
    [spec] = Submitter(ws, actor="t").submit([SubmitRequest(program="true", pool="B")])
    job = locate_key(ws, spec.placement, spec.key)
    assert job is not None
    ready = transition(ws, job, State.READY, Body(), actor="t")
    claimed = transition(ws, ready, State.CLAIMED, Body(), actor="t")
    made = os.path.dirname(ready.path(ws))
    os.rmdir(made)  # emptied, and retired by another manager
    synced = _recording_fsyncs(monkeypatch)
    again = transition(ws, claimed, State.READY, Body(), actor="t")
    assert os.path.isfile(again.path(ws))
    assert ws.state_dir(State.READY, spec.placement) in synced, synced
    ws.close()


def test_a_flat_workspace_takes_class_directories_by_its_policy_key_and_fsck_repair(
    tmp_path: Path,
) -> None:
    """docs/operations.md's way to give a workspace of an earlier revision the layout:
    managers stopped, the key added by hand, `flow fsck --repair` moves every ready job of
    a class into its directory; nothing is lost and each job runs once."""
    root = _workspace(tmp_path, "--no-class-dirs")
    fmt = Path(root, ".flow", "format.json")
    doc = orjson.loads(fmt.read_bytes())
    doc["policy"]["class_dirs"] = True
    fmt.write_bytes(orjson.dumps(doc))
    fsck = orjson.loads(flow("-w", root, "fsck", "--json").stdout)
    assert [p["kind"] for p in fsck["problems"]] == ["misplaced_marker"] * 10
    fsck = orjson.loads(flow("-w", root, "fsck", "--repair", "--json").stdout)
    assert all(p["repaired"] for p in fsck["problems"]) and len(fsck["problems"]) == 10
    ws = Workspace.open(root)
    assert sum(1 for p in markers_in(ws, State.READY) if "/@" in p) == 10
    ws.close()
    for pool in ("A", "B", "default"):
        ok("-w", root, "run", "--pool", pool, "--idle", "0", "--quiet")
    assert _states(root) == {"succeeded": 12}
    assert orjson.loads(ok("-w", root, "fsck", "--json"))["problems"] == []
