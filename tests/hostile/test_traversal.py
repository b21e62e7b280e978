"""Path traversal through every name that becomes a path: placements, tags, child labels,
attempt names and operator requests. Each is refused with a clear message, nothing is
created outside the workspace, and the manager serves the other jobs."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from helpers import wait_for
from manager.support import Managers, OrphanReaper, job, make_workspace, submit, write_script

from httk_flow.cli.main import cli
from httk_flow.protocol import requests
from httk_flow.protocol.leases import ManagerInfo, write_heartbeat
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import locate_key
from httk_flow.protocol.workspace import Workspace

from .support import HOSTILE, handle_of, handles, job_now, plant_frame, snapshot


def _everything_beside(
    ws_root: str, ignore: tuple[str, ...] = ()
) -> dict[str, tuple[int, int, bool]]:
    """A snapshot of the directory holding the workspace, the workspace itself left out."""
    skip = {Path(ws_root).name, *ignore}
    return {
        k: v for k, v in snapshot(Path(ws_root).parent).items() if k.split(os.sep)[0] not in skip
    }


@pytest.fixture
def cli_runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("NO_COLOR", "1")
    return CliRunner()


REFUSED_SUBMISSIONS = {
    "placement_dotdot": ["--placement", "../x"],
    "placement_inner_dotdot": ["--placement", "a/../../x"],
    "placement_absolute": ["--placement", "/tmp/x"],
    "placement_flow": ["--placement", ".flow/state"],
    "placement_hidden": ["--placement", "a/.b"],
    "placement_nul": ["--placement", "a\x01b"],
    "tag_slash": ["--tag", "a/b"],
    "tag_dotdot": ["--tag", "../x"],
    "tag_dot": ["--tag", ".x"],
}


@pytest.mark.parametrize("case", sorted(REFUSED_SUBMISSIONS))
def test_a_submission_naming_a_path_outside_is_refused(
    root: str, scripts: Path, cli_runner: CliRunner, case: str
) -> None:
    prog = write_script(scripts, "ok.sh", "exit 0\n")
    before = _everything_beside(root)
    args = REFUSED_SUBMISSIONS[case]
    r = cli_runner.invoke(cli, ["-w", root, "submit", *args, prog])
    assert r.exit_code == 2, r.output
    assert "flow: error:" in r.output and args[0].lstrip("-") in r.output, r.output
    assert not handles(root)
    assert _everything_beside(root) == before


@pytest.mark.parametrize(
    "line",
    [{"placement": "../x"}, {"tag": "a/b"}, {"placement": "/abs"}, {"tag": "../../x"}],
    ids=["placement_dotdot", "tag_slash", "placement_absolute", "tag_dotdot"],
)
def test_a_bulk_line_naming_a_path_outside_refuses_the_whole_file(
    root: str, scripts: Path, cli_runner: CliRunner, tmp_path: Path, line: dict[str, str]
) -> None:
    prog = write_script(scripts, "ok.sh", "exit 0\n")
    lines = tmp_path / "jobs.jsonl"
    lines.write_bytes(b'{"name": "fine"}\n' + orjson.dumps(line) + b"\n")
    before = _everything_beside(root)
    r = cli_runner.invoke(cli, ["-w", root, "submit", "--from", str(lines), prog])
    assert r.exit_code == 2, r.output
    assert "jobs.jsonl:2" in r.output, r.output
    assert not handles(root), "no line is published when one is refused"
    assert _everything_beside(root) == before


def test_after_every_refusal_a_manager_serves_the_workspace(
    root: str, scripts: Path, cli_runner: CliRunner, managers: Managers
) -> None:
    prog = write_script(scripts, "ok.sh", "exit 0\n")
    for args in REFUSED_SUBMISSIONS.values():
        assert cli_runner.invoke(cli, ["-w", root, "submit", *args, prog]).exit_code == 2
    [jid] = submit(root, prog)
    assert managers.run(root) == 0
    assert job(root, jid).state is State.SUCCEEDED
    assert [h.job_id for h in handles(root)] == [jid]


def test_a_manager_refuses_a_placement_outside(root: str, cli_runner: CliRunner) -> None:
    r = cli_runner.invoke(cli, ["-w", root, "run", "--placement", "../x"])
    assert r.exit_code == 2, r.output
    assert "placement" in r.output


#: HOSTILE modes naming a child by a label or tag that would leave the parent's directory
CHILD_MODES = (
    "spawn_dotdot",
    "python_spawn_dotdot",
    "children_label_dotdot",
    "children_tag_slash",
)


@pytest.fixture(scope="module")
def children_scene(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, dict[str, str]]]:
    base = tmp_path_factory.mktemp("traversal")
    root = make_workspace(base / "ws")
    prog = write_script(base / "scripts", "hostile.sh", HOSTILE)
    ids = {mode: submit(root, prog, params={"mode": mode})[0] for mode in CHILD_MODES}
    ids["good"] = submit(root, prog, params={"mode": "good"})[0]
    (base / "logs").mkdir()
    before = _everything_beside(root, ignore=("logs",))
    with OrphanReaper():
        managers = Managers(base / "logs")
        try:
            rc = managers.run(root)
        finally:
            managers.close()
    assert rc in (0, 1)
    assert _everything_beside(root, ignore=("logs",)) == before
    yield root, ids


@pytest.mark.parametrize("mode", CHILD_MODES)
def test_a_child_label_or_tag_with_a_path_fails_its_parent(
    children_scene: tuple[str, dict[str, str]], mode: str
) -> None:
    root, ids = children_scene
    info = job(root, ids[mode])
    assert info.state is State.FAILED, info.last
    assert info.failure_code == "protocol_error", info.last
    message = info.last["failure"]["message"]
    assert "../x" in message and ("label" in message or "tag" in message), message
    assert not [h for h in handles(root) if h.placement.endswith(info.handle.key)]
    assert not (Path(root) / info.handle.placement / "x").exists()
    assert job(root, ids["good"]).state is State.SUCCEEDED


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.mark.parametrize("where", ["frame", "attempts_link"])
def test_an_attempt_directory_named_by_a_frame_is_not_followed_outside(
    root: str, scripts: Path, managers: Managers, outside: Path, where: str
) -> None:
    """A frame whose attempt names a directory outside the job: the attempt's directory is
    derived from its number (aNNNN beside job.json), so the decoy outcome outside is never
    read. Nor is it through attempts/ (where protocol revisions up to 5 made attempt
    directories, still read) when that is a link outside holding a0001/.

    The dead owner left a heartbeat on this host (its process gone), so the takeover has
    evidence at once; an owner with no heartbeat at all is only taken for dead after a
    whole takeover grace (a heartbeat may show up late on a shared filesystem)."""
    decoy = outside / "attempt" / "outcome.ready"
    decoy.mkdir(parents=True)
    (decoy / "outcome.json").write_text('{"action":"succeed","message":"OUTSIDE"}')
    before = snapshot(outside)
    prog = write_script(scripts, "hostile.sh", HOSTILE)
    [jid] = submit(root, prog, params={"mode": "good"})
    good = submit(root, prog, count=2, params={"mode": "good"})
    dead = _dead_pid()
    ws = Workspace.open(root)
    try:
        write_heartbeat(ws, ManagerInfo("mgonelongago", ws.host, dead, time.time() - 3600))
        h = handle_of(ws, jid)
        if where == "attempts_link":
            os.rename(outside / "attempt", outside / "a0001")
            os.symlink(outside, os.path.join(ws.job_dir(h.placement, h.key), "attempts"))
            before = snapshot(outside)
        h = plant_frame(ws, h, State.READY)
        h = plant_frame(ws, h, State.CLAIMED, **{"try": 1, "tries": 1})
        attempt = {
            "id": "a0001",
            "n": 1,
            "manager": "mgonelongago",
            "host": ws.host,
            "pid": dead,
            "pgid": dead,
            "start_time": 1,
            "step": "main",
            "dir": str(outside / "attempt"),
        }
        plant_frame(ws, h, State.RUNNING, attempt=attempt)
    finally:
        ws.close()
    assert managers.run(root) in (0, 1)
    for g in good:
        assert job(root, g).state is State.SUCCEEDED
    info = job(root, jid)
    taken = [f for f in info.frames if f.get("by") not in ("hostile", "test")]
    assert any(f.get("evidence") for f in taken), info.frames
    assert "OUTSIDE" not in str(info.frames), info.frames
    assert snapshot(outside) == before


@pytest.mark.parametrize("member", ["dir", "id"])
def test_flow_logs_reads_no_file_outside_the_job(
    root: str, scripts: Path, outside: Path, cli_runner: CliRunner, member: str
) -> None:
    secret = outside / "attempt"
    secret.mkdir()
    (secret / "stdout").write_text("SECRET FROM OUTSIDE\n")
    prog = write_script(scripts, "hostile.sh", HOSTILE)
    [jid] = submit(root, prog)
    ws = Workspace.open(root)
    try:
        h = handle_of(ws, jid)
        job_dir = Path(ws.job_dir(h.placement, h.key))
        attempt = {"id": "a0001", "n": 1, "manager": "m", "host": "h", "step": "main"}
        if member == "dir":
            attempt["dir"] = str(secret)
        else:
            attempt["id"] = os.path.relpath(secret, job_dir)
        h = plant_frame(ws, h, State.READY)
        h = plant_frame(ws, h, State.CLAIMED, attempt=attempt)
    finally:
        ws.close()
    r = cli_runner.invoke(cli, ["-w", root, "logs", jid])
    assert "SECRET" not in r.output


# -- operator requests (pause) ---------------------------------------------------------
# Written against the public behaviour: `flow pause`, `flow requests`, and files planted
# where requests are read (requests.new_dir). Nothing here depends on how a manager
# claims or retires a request internally.

#: a job whose only step waits for $FLOW_WORKDIR/release, then advances to `two`
HELD = r"""
case "$FLOW_STEP" in
main)
    touch "$FLOW_WORKDIR/started"
    until [ -e "$FLOW_WORKDIR/release" ]; do sleep 0.05; done
    publish '{"action":"advance","step":"two"}' ;;
*) publish '{"action":"succeed"}' ;;
esac
"""


def _request_name(job_id: str, gen: int = 0, nonce: str = "0badc0de") -> str:
    """A name of the request grammar (the planted files must get past the name check)."""
    return requests.Request(
        op="pause",
        job_id=job_id,
        key=job_id,
        placement="jobs/00",
        gen=gen,
        nonce=nonce,
        t=0.0,
        by="test",
    ).name


def _request_views(root: str) -> list[dict[str, object]]:
    r = CliRunner().invoke(cli, ["-w", root, "requests", "--json"])
    assert r.exit_code == 0, r.output
    rows = orjson.loads(r.output)["requests"]
    assert isinstance(rows, list)
    return rows


def _plant_hostile_requests(root: str, jid: str, outside: Path) -> dict[str, str]:
    """Entries no CLI wrote, beside a real request: name -> what it is."""
    target = outside / "target"
    target.write_text("keep me")
    ws = Workspace.open(root)
    try:
        h = handle_of(ws, jid)
        real = requests.Request(
            op="pause",
            job_id=jid,
            key=h.key,
            placement=h.placement,
            gen=h.marker.generation,
            nonce="1badc0de",
            t=time.time(),
            by="test",
        )
        d = Path(requests.new_dir(ws))
    finally:
        ws.close()
    d.mkdir(parents=True, exist_ok=True)
    planted: dict[str, str] = {}
    for name in ["..x", "...", "x\ny", jid.upper(), jid + ".tmp", " " + jid, "%2e%2e", jid]:
        (d / name).write_text("{}")
        planted[name] = "not a request name"
    # request names, but not request files: each must be refused unread, never followed
    link = _request_name(jid, nonce="0000000a")
    (d / link).symlink_to(target)
    planted[link] = "symbolic link"
    linked_dir = _request_name(jid, nonce="0000000b")
    (d / linked_dir).symlink_to(outside, target_is_directory=True)
    planted[linked_dir] = "symbolic link"
    a_dir = _request_name(jid, nonce="0000000c")
    (d / a_dir).mkdir()
    planted[a_dir] = "directory"
    fifo = _request_name(jid, nonce="0000000d")
    os.mkfifo(d / fifo)
    planted[fifo] = "fifo"
    big = _request_name(jid, nonce="0000000e")
    (d / big).write_bytes(b"x" * 1_000_000)
    planted[big] = "oversized"
    # a well-formed file whose body lies: another placement (a path out), another name
    body = real.to_json()
    escape = _request_name(jid, nonce="0000000f")
    (d / escape).write_bytes(orjson.dumps({**body, "nonce": "0000000f", "placement": "../.."}))
    planted[escape] = "placement outside"
    liar = _request_name(jid, nonce="00000010")
    (d / liar).write_bytes(orjson.dumps(body))
    planted[liar] = "body disagrees with its name"
    return planted


def _visible(planted: dict[str, str]) -> list[str]:
    """Planted names a manager retires: a hidden name is a request still being written
    (a writer's temporary); it is never read, only removed once it is an hour old."""
    return [n for n in planted if not n.startswith(".")]


def test_hostile_request_files_are_retired_with_a_reason_and_never_followed(
    root: str, scripts: Path, managers: Managers, outside: Path
) -> None:
    prog = write_script(scripts, "hostile.sh", HOSTILE)
    [jid] = submit(root, prog, params={"mode": "good"})
    good = submit(root, prog, count=2, params={"mode": "good"})
    planted = _plant_hostile_requests(root, jid, outside)
    before = snapshot(outside)
    # the listing itself reads every entry safely: no FIFO blocks it, no link is followed
    listed = {str(v["name"]): v for v in _request_views(root)}
    for name in planted:
        if name in listed:
            assert listed[name]["status"] in ("invalid", "retired"), listed[name]
    p = managers.start(root, workers=2)
    rc = p.wait(60)
    assert p.log is not None
    log = p.log.read_text(errors="replace")
    assert "Traceback" not in log, log
    assert rc in (0, 1), log
    for g in good:
        assert job(root, g).state is State.SUCCEEDED
    # no planted request applied: the job ran as if nothing had been asked
    assert job(root, jid).state is State.SUCCEEDED
    assert snapshot(outside) == before
    assert (outside / "target").read_text() == "keep me"
    rows = _request_views(root)
    assert not [r for r in rows if r["status"] in ("pending", "claimed")], rows
    retired = [r for r in rows if r["status"] != "applied"]
    assert len(retired) >= len(_visible(planted)), rows
    assert all(r["reason"] for r in retired), rows


def test_flow_pause_of_a_running_job_applies_beside_hostile_requests(
    root: str, scripts: Path, managers: Managers, outside: Path
) -> None:
    """The real request made by `flow pause` is applied once, when the attempt ends;
    the planted ones around it are retired, and nothing outside changes."""
    [jid] = submit(root, write_script(scripts, "held.sh", HELD))
    p = managers.start(root, workers=2)
    wait_for(lambda: (job_now(root, jid).job_dir(root) / "run" / "started").exists(), 30)
    planted = _plant_hostile_requests(root, jid, outside)
    before = snapshot(outside)
    r = CliRunner().invoke(cli, ["-w", root, "pause", jid])
    assert r.exit_code == 0, r.output
    (job_now(root, jid).job_dir(root) / "run" / "release").touch()
    rc = p.wait(60)
    assert p.log is not None
    log = p.log.read_text(errors="replace")
    assert "Traceback" not in log, log
    assert rc in (1, 4), log  # 4: it stopped with the paused job left
    info = job(root, jid)
    assert info.state is State.PAUSED, info.frames
    assert info.last["step"] == "two", info.last  # paused at the step it advanced to
    assert snapshot(outside) == before
    rows = _request_views(root)
    assert [r["status"] for r in rows].count("applied") == 1, rows
    assert not [r for r in rows if r["status"] in ("pending", "claimed")], rows
    assert len([r for r in rows if r["status"] != "applied"]) >= len(_visible(planted)), rows


@pytest.mark.parametrize(
    "ident", ["../outside/victim", "/etc/passwd", "..", ".flow/requests", "a/../../b"]
)
def test_flow_pause_of_a_path_is_refused_and_touches_nothing(
    root: str, outside: Path, ident: str
) -> None:
    victim = outside / "victim"
    victim.write_text("keep me")
    before = snapshot(outside)
    r = CliRunner().invoke(cli, ["-w", root, "pause", ident])
    assert r.exit_code != 0, r.output
    assert "Traceback" not in r.output
    assert snapshot(outside) == before
    assert victim.read_text() == "keep me"
    assert not [v for v in _request_views(root) if v["status"] == "pending"]


@pytest.mark.parametrize("placement", ["../../../../outside", "a/../../../../../outside", "/"])
def test_locating_a_job_never_lists_a_placement_leading_outside(
    root: str, outside: Path, placement: str
) -> None:
    """A placement read from a damaged frame or request: the job is simply not there, and
    no directory outside the state tree is listed to look for it."""
    key = "0123456789abcdef0123456789abcdef"
    (outside / f"{key}.p500.g0.w-0-0").write_text("")
    ws = Workspace.open(root)
    try:
        assert os.path.realpath(ws.state_dir(State.READY, placement)) in (
            str(outside.resolve()),
            "/",
        )
        assert locate_key(ws, placement, key) is None
    finally:
        ws.close()
