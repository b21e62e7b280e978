"""`flow fsck`: a clean workspace is clean; every injected inconsistency is found with its
kind; `--repair` fixes exactly the provably safe ones."""

from __future__ import annotations

import dataclasses
import datetime as dt
import errno
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from manager.support import Managers, submit

from httk_flow.cli.main import cli as cli_main
from httk_flow.ops import steering
from httk_flow.ops.fsck import Fsck
from httk_flow.protocol import leases
from httk_flow.protocol.frames import AttemptRecord, Body, Snapshot
from httk_flow.protocol.leases import ManagerInfo
from httk_flow.protocol.names import Marker, RecordRef
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import locate_key, transition
from httk_flow.protocol.workspace import Workspace

from .support import FLOW, Flow, patch_policy, walk_while_moving

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
        "read_only": False,
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
    torn = (
        f"unreadable_frame: {seg}: 1 line(s) are not readable frames "
        f"(first at byte {claimed.offset})"
    )
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
        # nothing left that --repair fixes: no hint to run it
        "\n".join([summary(flow, 3, 2), f"problem: {missing}", f"problem: {torn}"]) + "\n",
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
    report = walk_while_moving(
        root,
        "httk_flow.ops.fsck.MarkerStream",
        after,
        move,
        lambda ws: Fsck(ws, repair=repair).run(),
    )
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


# -- a workspace fsck cannot write to -------------------------------------------------------


def _mount_tmpfs(mnt: Path, options: str) -> None:
    """A small tmpfs of our own (root may mount one); without one the read-only tests
    cannot run, which CI must not take for a pass."""
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if r.returncode != 0:
        why = f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode})"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}: CI must run the read-only fsck tests")
        pytest.skip(why)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 32 MiB tmpfs with 2,000 inodes, unmounted at teardown."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    _mount_tmpfs(mnt, "size=32m,nr_inodes=2000")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def mounted(small_fs: Path, runner: CliRunner, managers: Managers) -> Flow:
    """A workspace on the small tmpfs with two jobs run to success."""
    root = str(small_fs / "ws")
    r = runner.invoke(cli_main, ["init", root])
    assert r.exit_code == 0, r.output
    patch_policy(root, backoff_base=0.2, backoff_cap=2.0)
    # submitted through a workspace closed afterwards: a journal segment left open for
    # writing (as in-process CLI calls leave theirs) would keep the remount from happening
    for tag in ("r1", "r2"):
        submit(root, "true", tag=tag)
    assert managers.run(root) == 0
    return Flow(root, runner)


def _remount_read_only(mnt: Path) -> None:
    r = subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def _fill_inodes(mnt: Path) -> int:
    """Create empty files beside the workspace until the filesystem has no inode left."""
    filler = mnt / "filler"
    filler.mkdir()
    n = 0
    while True:
        try:
            os.close(os.open(filler / str(n), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
            return n
        n += 1


def read_only_line(flow: Flow, reason: str) -> str:
    lock = Path(flow.root) / ".flow" / "fsck.lock"
    return f"read-only: {lock} cannot be created ({reason}); checking without repairs"


def refusal(flow: Flow, reason: str) -> str:
    lock = Path(flow.root) / ".flow" / "fsck.lock"
    return (
        f"flow: error: {lock}: cannot be created ({reason}), so flow fsck cannot repair "
        "here; run `flow fsck` without --repair to check read-only, or make the workspace "
        "writable first\n"
    )


def test_a_read_only_workspace_is_checked_without_repairs_and_says_so(
    mounted: Flow, small_fs: Path
) -> None:
    flow = mounted
    notes = flow.marker(flow.show("r1")).parent / "notes.txt"
    notes.write_text("hello\n")
    seg = max(segments(flow.root), key=lambda p: p.stat().st_size)
    stray = seg.stat().st_size
    with open(seg, "ab") as fh:
        fh.write(b"a stray line\n")
    _remount_read_only(small_fs)
    reason = "Read-only file system"
    bad_notes = f"problem: bad_entry: {notes}: {NOT_A_MARKER}"
    bad_line = (
        f"problem: unreadable_frame: {seg}: 1 line(s) are not readable frames "
        f"(first at byte {stray})"
    )

    r = flow("fsck")
    assert (r.exit_code, r.output) == (
        1,
        "\n".join([read_only_line(flow, reason), summary(flow, 2, 2), bad_notes, bad_line]) + "\n",
    )
    doc = flow.json("fsck", code=1)
    assert (doc["read_only"], doc["read_only_reason"], doc["clean"]) == (True, reason, False)
    assert [(p["kind"], p["repaired"]) for p in doc["problems"]] == [
        ("bad_entry", False),
        ("unreadable_frame", False),
    ]

    r = flow("fsck", "--repair")
    assert (r.exit_code, r.stdout, r.stderr) == (1, "", refusal(flow, reason))
    assert notes.exists() and not (Path(flow.root) / ".flow" / "lost+found").exists()


def test_a_workspace_out_of_inodes_is_checked_read_only(mounted: Flow, small_fs: Path) -> None:
    flow = mounted
    assert _fill_inodes(small_fs) > 0
    reason = "No space left on device"
    r = flow("fsck")
    assert (r.exit_code, r.output) == (
        0,
        "\n".join([read_only_line(flow, reason), summary(flow, 2, 2), "clean"]) + "\n",
    )
    doc = flow.json("fsck")
    assert (doc["read_only"], doc["read_only_reason"], doc["clean"]) == (True, reason, True)
    r = flow("fsck", "--repair")
    assert (r.exit_code, r.stdout, r.stderr) == (1, "", refusal(flow, reason))


def test_a_writable_workspace_says_nothing_of_read_only(
    flow: Flow, jobs: dict[str, dict[str, str]]
) -> None:
    assert "read-only" not in flow("fsck").output
    assert "read_only_reason" not in flow.json("fsck")


# -- jobs stuck in an active state ------------------------------------------------------------


def _entered(flow: Flow, job: dict[str, str]) -> float:
    """When the job's marker was last renamed (its state entered), in the filesystem's clock."""
    return flow.marker(job).stat().st_ctime


def _stamp(t: float) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _fsck_at(flow: Flow, monkeypatch: pytest.MonkeyPatch, now: float) -> tuple[int, str]:
    """`flow fsck` with the filesystem's clock, as fsck (and the leases it reads) sees it, at
    `now`: its exit status and output."""
    with monkeypatch.context() as m:
        m.setattr(leases, "fs_now", lambda ws: now)
        r = flow("fsck")
    return r.exit_code, r.output


def _one_problem(flow: Flow, line: str) -> tuple[int, str]:
    """What `_fsck_at` gives for a workspace of one job with the one problem `line`."""
    return 1, f"{summary(flow, 1, 1)}\n{line}\n"


def test_a_job_claimed_by_a_manager_that_died_is_reported_until_the_next_manager_recovers_it(
    flow: Flow, managers: Managers, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = flow.submit("--tag", "held", "true")
    # the manager is killed right after it claimed the job, before launching anything
    assert managers.run(flow.root, env={"FLOW_CRASH_AT": "claim.after_claim"}) == -9
    assert flow.state("held") == "claimed"
    owner = flow.history("held")[-1]["attempt"]["manager"]
    since = _entered(flow, job)
    dead = (
        f"problem: dead_owner: job {job['key']}: claimed, held by dead manager {owner} on "
        f"{socket.gethostname()} since {_stamp(since)} (90 s ago); the next manager "
        "recovers it"
    )
    # nothing for --repair to do: no hint to run it
    assert _fsck_at(flow, monkeypatch, since + 90) == _one_problem(flow, dead)

    assert managers.run(flow.root) == 0
    assert flow.state("held") == "succeeded"
    assert flow("fsck").output == summary(flow, 1, 1) + "\nclean\n"


ELSEWHERE = "node-b"
OTHER = "m-elsewhere"


def _held_by_a_live_manager_elsewhere(
    flow: Flow, job: dict[str, str], state: State, owner: str = OTHER, heartbeat: bool = True
) -> None:
    """Move the ready job to `state` (through the states between) as a manager on another
    host would, with its heartbeat written; the job's process is on that host."""
    ws = Workspace.open(flow.root)
    try:
        if heartbeat:
            leases.write_heartbeat(
                ws, ManagerInfo(id=owner, host=ELSEWHERE, pid=4242, started=time.time())
            )
        h = locate_key(ws, job["placement"], job["key"])
        assert h is not None and h.state is State.READY
        attempt = AttemptRecord(
            n=1, id="a0001", manager=owner, host=ELSEWHERE, step="main", pid=4242
        )
        for st in (State.CLAIMED, State.RUNNING, State.COMMITTING):
            body = Body(Snapshot(step="main"), attempt=attempt)
            h = transition(ws, h, st, body, actor=owner)
            if st is state:
                return
    finally:
        ws.close()


@pytest.mark.parametrize("state", [State.CLAIMED, State.COMMITTING, State.RUNNING])
def test_a_job_held_past_the_bound_by_a_live_manager_is_stuck_unless_it_is_running(
    flow: Flow, managers: Managers, monkeypatch: pytest.MonkeyPatch, state: State
) -> None:
    job = flow.submit("--tag", "slow", "--pool", "elsewhere", "true")
    assert managers.run(flow.root) == 0  # registers it; nobody here serves the pool
    _held_by_a_live_manager_elsewhere(flow, job, state)
    since = _entered(flow, job)
    beat = Path(flow.root) / ".flow" / "managers" / OTHER / "heartbeat.json"

    def at(now: float) -> tuple[int, str]:
        os.utime(beat, (now - 1, now - 1))  # its manager heartbeats on: alive all along
        return _fsck_at(flow, monkeypatch, now)

    clean = f"{summary(flow, 1, 1)}\nclean\n"
    # under the bound (max(10 min, 20 x the 30 s lease)): a slow launch or commit, not stuck
    assert at(since + 9 * 60) == (0, clean)
    if state is State.RUNNING:
        assert at(since + 3600) == (0, clean)  # a job may run for days
        return
    stuck = (
        f"problem: stuck_job: job {job['key']}: {state.value} for 60 min (since "
        f"{_stamp(since)}), past the 10 min bound, by live manager {OTHER} on {ELSEWHERE}; "
        "it may be hung: look at its log, or stop it and the next manager recovers the job"
    )
    assert at(since + 3600) == _one_problem(flow, stuck)
    # its heartbeat goes silent: now the lease has ended, and that is the reason given
    os.utime(beat, (since, since))
    dead = (
        f"problem: dead_owner: job {job['key']}: {state.value}, held by dead manager {OTHER} "
        f"on {ELSEWHERE} since {_stamp(since)} (60 min ago); the next manager recovers it"
    )
    assert _fsck_at(flow, monkeypatch, since + 3600) == _one_problem(flow, dead)


def test_a_job_held_by_a_manager_without_a_heartbeat_is_reported_after_the_takeover_grace(
    flow: Flow, managers: Managers, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = flow.submit("--tag", "ghost", "--pool", "elsewhere", "true")
    assert managers.run(flow.root) == 0
    _held_by_a_live_manager_elsewhere(flow, job, State.RUNNING, "m-ghost", heartbeat=False)
    since = _entered(flow, job)
    # within lease x takeover_factor its heartbeat may yet show up (a shared filesystem)
    assert _fsck_at(flow, monkeypatch, since + 50) == (0, f"{summary(flow, 1, 1)}\nclean\n")
    ghost = (
        f"problem: dead_owner: job {job['key']}: running, held by manager m-ghost on "
        f"{ELSEWHERE}, which has no heartbeat, since {_stamp(since)} (5 min ago); the next "
        "manager recovers it"
    )
    assert _fsck_at(flow, monkeypatch, since + 300) == _one_problem(flow, ghost)


def test_a_payload_whose_birth_marker_was_never_moved_out_is_published_by_repair(
    flow: Flow,
) -> None:
    r = subprocess.run(
        [*FLOW, "-w", flow.root, "submit", "--tag", "unborn", "true"],
        env={**os.environ, "FLOW_CRASH_AT": "submit.after_payload"},
        capture_output=True,
        timeout=60,
    )
    assert r.returncode == -9, r.stderr
    [payload] = (Path(flow.root) / "jobs").glob("*/unborn--*")
    [born] = [p.name for p in payload.iterdir() if p.name.startswith(".birth.")]
    old = time.time() - TWO_HOURS
    os.utime(payload, (old, old))
    target = (
        Path(flow.root) / ".flow" / "state" / "submitted" / payload.parent.relative_to(flow.root)
    )
    why = (
        f"orphan_payload: {payload}: its registration stopped before its marker "
        f"{born} was moved out (2.0 h old)"
    )
    r = flow("fsck")
    assert (r.exit_code, r.output) == (
        1,
        f"{summary(flow, 0, 1)}\nproblem: {why}; `flow fsck --repair` publishes the job\n"
        "run `flow fsck --repair` to fix what is safe to fix\n",
    )
    r = flow("fsck", "--repair")
    assert (r.exit_code, r.output) == (0, f"{summary(flow, 1, 1)}\nrepaired: {why}; published it\n")
    # the job is whole: its payload where it was, its one marker in submitted/
    assert [p.name for p in target.iterdir()] == [born.removeprefix(".birth.")]
    assert not (payload / born).exists() and (payload / "job.json").is_file()
    r = flow("fsck")
    assert (r.exit_code, r.output) == (0, f"{summary(flow, 1, 1)}\nclean\n")
