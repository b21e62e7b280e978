"""The manager logs itself: every transition it makes has exactly one log line, in order.

The lines come from the workspace's transition observer, not from hand-written calls, so
moves that used to go unlogged (a launch error that fails a job, a released claim) are
logged too. A real `flow run` serves jobs that succeed, fail, retry, advance, fan out, are
cancelled and cannot launch; a claim released by a drain is shown with a real manager.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import orjson
from helpers import manager_in_this_process, wait_for

from httk_flow.manager.config import ManagerConfig
from httk_flow.manager.loop import Manager
from httk_flow.protocol import jobs
from httk_flow.protocol.journal import RawFrame as Frame
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle
from httk_flow.protocol.workspace import Workspace

from .support import (
    FAMILY,
    THREE_STEPS,
    JobInfo,
    Managers,
    all_jobs,
    dump,
    flow,
    job,
    log_of,
    submit,
    whole_log,
    write_script,
)

#: `HH:MM:SS manager key from -> to (why)`, the why left out when empty
LINE = re.compile(r"^(\d\d:\d\d:\d\d) (m\w+) (\S+) (\w+) -> (\w+)(?: \((.*)\))?$")

OK = """publish '{"action":"succeed","message":"fine"}'"""
FAIL = """publish '{"action":"fail","code":"broken","message":"no"}'"""
#: the first attempt exits without an outcome (retried), the second succeeds
RETRY = """
if [ "$(bump main)" -eq 1 ]; then exit 1; fi
publish '{"action":"succeed"}'
"""
#: sleeps until cancelled
SLEEP = """
touch "$FLOW_WORKDIR/started"
sleep 30
"""


def transition_lines(text: str) -> list[tuple[str, str, str, str, str]]:
    """(manager, key, from, to, why) of every transition line of a text log."""
    out = []
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            out.append((m[2], m[3], m[4], m[5], m[6] or ""))
    return out


def moves_by(info: JobInfo, actor: str) -> list[tuple[str, str]]:
    """(from, to) of every transition of the job's history made by `actor`, oldest first
    (a birth frame, written when the job is created, is no transition)."""
    return [
        (str(f["from"]), str(f["to"])) for f in info.frames if f.get("by") == actor and "from" in f
    ]


def test_every_transition_of_a_real_run_has_exactly_one_log_line(
    root: str, scripts: Path, managers: Managers, tmp_path: Path
) -> None:
    ids = {
        "ok": submit(root, write_script(scripts, "ok.sh", OK))[0],
        "fail": submit(root, write_script(scripts, "fail.sh", FAIL), retries=0)[0],
        "retry": submit(root, write_script(scripts, "retry.sh", RETRY), retries=2)[0],
        "steps": submit(root, write_script(scripts, "steps.sh", THREE_STEPS))[0],
        "family": submit(root, write_script(scripts, "family.sh", FAMILY), params={"kids": 2})[0],
        "cancel": submit(root, write_script(scripts, "sleep.sh", SLEEP))[0],
        "nolaunch": submit(root, write_script(scripts, "never.sh", OK))[0],
    }
    # the launch error: the first attempt's directory is a symbolic link, which is refused
    outside = tmp_path / "outside"
    outside.mkdir()
    (job(root, ids["nolaunch"]).job_dir(root) / "a0001").symlink_to(outside)

    p = managers.start(root, command="run", workers=8, quiet=False)
    workdir = job(root, ids["cancel"]).job_dir(root) / "run"
    wait_for(lambda: (workdir / "started").exists() or p.poll() is not None, 20)
    assert p.poll() is None, log_of(p)
    assert flow("-w", root, "cancel", ids["cancel"]).returncode == 0
    p.wait(60)
    text = whole_log(p)

    expected = {
        "ok": State.SUCCEEDED,
        "fail": State.FAILED,
        "retry": State.SUCCEEDED,
        "steps": State.SUCCEEDED,
        "family": State.SUCCEEDED,
        "cancel": State.CANCELLED,
        "nolaunch": State.FAILED,
    }
    for name, state in expected.items():
        assert job(root, ids[name]).state is state, (name, dump(root), text)
    assert job(root, ids["nolaunch"]).failure_code == "launch_error", dump(root)

    lines = transition_lines(text)
    [manager] = {m for m, *_ in lines}
    everything = all_jobs(root)
    assert len(everything) == len(expected) + 2  # the family's two children
    for info in everything:
        logged = [(src, dst) for _, key, src, dst, _ in lines if key == info.handle.key]
        assert logged == moves_by(info, manager), (info.handle.key, dump(root), text)
    # every line belongs to a frame: nothing is logged twice or invented
    assert len(lines) == sum(len(moves_by(info, manager)) for info in everything)

    why = {(key, src, dst): w for _, key, src, dst, w in lines}
    nolaunch = job(root, ids["nolaunch"]).handle.key
    assert why[(nolaunch, "claimed", "failed")] == "launch_error"  # new: it had no line
    failing = job(root, ids["fail"]).handle.key
    assert why[(failing, "committing", "failed")] == "fail: broken"  # the code an operator greps
    cancel = job(root, ids["cancel"]).handle.key
    assert why[(cancel, "cancelling", "cancelled")] == "exit verified"
    retry = job(root, ids["retry"]).handle.key
    assert [w for _, key, src, dst, w in lines if key == retry and dst == "running"] == [
        "a0001",
        "a0002",
    ]
    # one sample line, compared whole (but for its time stamp)
    ok = job(root, ids["ok"]).handle.key
    [sample] = [line for line in text.splitlines() if f" {ok} claimed -> running" in line]
    assert re.fullmatch(r"\d\d:\d\d:\d\d", sample[:8]), sample
    assert sample[8:] == f" {manager} {ok} claimed -> running (a0001)"
    [done] = [line for line in text.splitlines() if f" {ok} running -> s" in line]
    assert done[8:] == f" {manager} {ok} running -> succeeded (succeed)"


def test_json_lines_carry_the_same_fields(root: str, scripts: Path, managers: Managers) -> None:
    [jid] = submit(root, write_script(scripts, "ok.sh", OK))
    p = managers.start(root, "--log-format", "json", command="run", quiet=False)
    assert p.wait(60) == 0, log_of(p)
    records = [orjson.loads(line) for line in whole_log(p).splitlines() if line.startswith("{")]
    moves = [r for r in records if r["event"] == "transition"]
    info = job(root, jid)
    key = info.handle.key
    assert [(r["from"], r["to"]) for r in moves] == moves_by(info, moves[0]["manager"])
    claim = next(r for r in moves if r["to"] == "running")
    assert set(claim) == {"t", "manager", "event", "job", "from", "to", "why"}
    assert (claim["job"], claim["from"], claim["why"]) == (key, "claimed", "a0001")


def test_a_claim_released_by_a_drain_is_logged(tmp_path: Path, scripts: Path) -> None:
    """A signal between claim and launch: the drain gives the claims back, each logged.

    The drain begins exactly when a signal would have to arrive (right after the first
    claim's rename), from a second observer of the same workspace."""
    ws = Workspace.create(str(tmp_path / "ws"))
    try:
        prog = write_script(scripts, "ok.sh", OK)
        submit(ws.root, prog, count=2)
        for h in list(jobs.all_jobs(ws, (State.SUBMITTED,))):
            jobs.register(ws, h, actor="test")
        manager = Manager(ws, ManagerConfig(workers=2, exit_when_idle=0, poll_interval=0.05))
        manager.log.stream = out = io.StringIO()

        def drain_on_claim(old: JobHandle, new: JobHandle, frame: Frame, note: str | None) -> None:
            if new.state is State.CLAIMED:
                manager.drain.begin("signal SIGTERM")

        ws.on_transition.append(drain_on_claim)
        with manager_in_this_process():
            assert manager.run(install_signals=False) == 0
        lines = transition_lines(out.getvalue())
        final = list(jobs.all_jobs(ws))
        assert [h.state for h in final] == [State.READY, State.READY], out.getvalue()
        for h in final:
            frames = jobs.history_json(ws, h)
            assert frames[-1]["why"] == "released"
            logged = [(src, dst, w) for _, key, src, dst, w in lines if key == h.key]
            assert logged == [("ready", "claimed", ""), ("claimed", "ready", "released")]
    finally:
        ws.close()
