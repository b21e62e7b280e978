"""Operator requests: files managers claim by rename, check against the generation they were
made for, apply exactly once, or retire with the reason they never can apply."""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path

import orjson
import pytest
from helpers import wait_for
from manager.support import ManagerProcess, Managers, log_of

from httk_flow.ops import lookup
from httk_flow.protocol import requests
from httk_flow.protocol.workspace import Workspace

from .support import (
    ADVANCE_ON_RELEASE,
    BROKEN_MAIN,
    Flow,
    patch_policy,
    wait_state,
    write_script,
)

#: one step that succeeds once released
SUCCEED_ON_RELEASE = """#!/usr/bin/env bash
source "$FLOW_BASH_API"
touch "$FLOW_WORKDIR/started"
until [ -e "$FLOW_WORKDIR/release" ]; do sleep 0.05; done
flow_succeed done
"""


def make_ready(flow: Flow, managers: Managers) -> None:
    assert managers.run(flow.root, "--pool", "nowhere") == 0


def request_for(root: str, ident: str, op: str, *, gen_back: int = 0, **kw: int) -> str:
    """Write a request as the CLI would for a running job, `gen_back` generations ago."""
    ws = Workspace.open(root)
    h = lookup.find(ws, ident)
    if gen_back:
        h = dataclasses.replace(
            h, marker=dataclasses.replace(h.marker, generation=h.marker.generation - gen_back)
        )
    return requests.make(ws, h, op, **kw).name


def by_name(flow: Flow) -> dict[str, dict[str, object]]:
    return {r["name"]: r for r in flow.json("requests")["requests"]}


def applications(flow: Flow, ident: str, name: str) -> list[int]:
    """Generations of the moves that applied the request `name` (a commit names it in its
    committing frames too, and again if another manager finished the commit)."""
    return [
        f["gen"]
        for f in flow.history(ident)
        if name in (f.get("requests") or []) and f["to"] != "committing"
    ]


def claimed_left(root: str) -> list[str]:
    base = Path(root) / ".flow" / "requests" / "claimed"
    return [str(p) for p in base.rglob("*") if p.is_file()] if base.exists() else []


def start_and_wait(
    flow: Flow, managers: Managers, program: str, tag: str
) -> tuple[dict[str, str], ManagerProcess, Path]:
    """Submit a job and serve it until its attempt has started."""
    job = flow.submit("--tag", tag, program)
    p = managers.start(flow.root, command="serve", workers=1)
    run = flow.job_dir(job) / "run"
    wait_for(lambda: (run / "started").exists() or p.poll() is not None, 20)
    assert p.poll() is None, log_of(p)
    return job, p, run


def test_a_priority_request_for_a_running_job_applies_when_its_attempt_ends(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    prog = write_script(scripts, "adv.sh", ADVANCE_ON_RELEASE)
    job, p, run = start_and_wait(flow, managers, prog, "prio")
    assert flow.ok("priority", "prio", "900") == (
        f"{job['key']}: running -> running (priority 900 when its current attempt ends)\n"
    )
    [pending] = flow.json("requests", "--pending")["requests"]
    assert (pending["op"], pending["priority"], pending["status"]) == ("priority", 900, "pending")
    assert flow.json("status")["requests_pending"] == 1
    assert "requests: 1 pending (see `flow requests`)" in flow.ok("status")
    (run / "release").touch()
    wait_state(flow, "prio", {"succeeded"})
    name = str(pending["name"])
    [gen] = applications(flow, "prio", name)
    [after] = [f for f in flow.history("prio") if f["gen"] == gen]
    assert (after["from"], after["to"], after["step"]) == ("committing", "ready", "two")
    assert flow.show("prio")["priority"] == 900
    rec = by_name(flow)[name]
    assert (rec["status"], rec["reason"]) == ("applied", f"applied at generation {gen}")
    assert claimed_left(flow.root) == []
    p.terminate()
    assert p.wait(10) == 0, log_of(p)


def test_a_pause_whose_job_ends_at_that_attempt_is_retired_with_the_reason(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    prog = write_script(scripts, "one.sh", SUCCEED_ON_RELEASE)
    job, p, run = start_and_wait(flow, managers, prog, "ends")
    flow.ok("pause", "ends")
    (run / "release").touch()
    wait_state(flow, "ends", {"succeeded"})
    wait_for(lambda: flow.json("requests", "--pending")["requests"] == [], 10)
    [rec] = flow.json("requests")["requests"]
    assert (rec["status"], rec["key"], rec["reason"]) == (
        "retired",
        job["key"],
        "the attempt ended the job as succeeded",
    )
    plain = flow.ok("requests").splitlines()
    assert plain[0].split() == ["STATUS", "REQUEST", "JOB", "GEN", "MANAGER", "REASON"]
    assert plain[1].split()[:3] == ["retired", "pause", job["key"]]
    p.terminate()
    assert p.wait(10) == 0, log_of(p)


def test_a_pause_made_before_a_failure_never_pauses_the_resumed_job(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    flow.submit("--tag", "broken", write_script(scripts, "broken.sh", BROKEN_MAIN))
    assert managers.run(flow.root) == 1
    failed_at = flow.history("broken")[-1]["gen"]
    # as if `flow pause` had run while the attempt that failed was still running
    name = request_for(flow.root, "broken", "pause", gen_back=2)
    flow.ok("resume", "broken", "--step", "fix")
    assert managers.run(flow.root) == 0
    assert flow.state("broken") == "succeeded"
    rec = by_name(flow)[name]
    assert (rec["status"], rec["reason"]) == (
        "retired",
        f"the job became failed at generation {failed_at} first",
    )


def test_requests_for_jobs_between_attempts_are_applied_once_by_one_of_three_managers(
    flow: Flow, managers: Managers
) -> None:
    keys = [flow.submit("--tag", f"j{i}", "true")["key"] for i in range(30)]
    make_ready(flow, managers)
    wanted: dict[str, list[str]] = {}
    for i, key in enumerate(keys):
        wanted[key] = [request_for(flow.root, key, "priority", priority=100 + i)]
        if i % 3 == 0:
            wanted[key].append(request_for(flow.root, key, "pause"))
    procs = [
        managers.start(flow.root, "--pool", "nowhere", command="serve", workers=1) for _ in range(3)
    ]
    wait_for(lambda: flow.json("requests", "--pending")["requests"] == [], 30)
    live = lambda: [m for m in flow.json("managers")["managers"] if m["alive"]]  # noqa: E731
    wait_for(lambda: len(live()) == 3, 20)  # each has its signal handlers in place
    for p in procs:
        p.terminate()
        assert p.wait(10) == 0, log_of(p)
    records = by_name(flow)
    assert len(records) == sum(len(v) for v in wanted.values())
    for i, key in enumerate(keys):
        for name in wanted[key]:
            assert records[name]["status"] == "applied", records[name]
            assert len(applications(flow, key, name)) == 1, flow.history(key)
        shown = flow.show(key)
        assert shown["priority"] == 100 + i
        assert shown["state"] == ("paused" if i % 3 == 0 else "ready")
    appliers = {r["manager"] for r in records.values()}
    assert appliers <= {f for f in os.listdir(Path(flow.root) / ".flow" / "managers")}
    assert claimed_left(flow.root) == []


def test_hostile_entries_in_the_request_inbox_are_retired_and_other_jobs_run(
    flow: Flow, managers: Managers, tmp_path: Path
) -> None:
    job = flow.submit("--tag", "victim", "true")
    make_ready(flow, managers)
    new = Path(flow.root) / ".flow" / "requests" / "new"
    new.mkdir(parents=True, exist_ok=True)
    jid, zero = job["id"], "0" * 32
    secret = tmp_path / "secret"
    secret.write_text("keep me")
    good = {"op": "pause", "job": jid, "key": job["key"], "placement": job["placement"]}
    good |= {"nonce": "00000001", "t": 1.0, "by": "x"}
    planted = {
        "garbage": b"x",
        f"pause.{jid}.g1.00000002": orjson.dumps({**good, "nonce": "00000002"} | {"gen": 1})[:-5],
        f"pause.{jid}.g1.00000003": orjson.dumps({**good, "gen": 1}),  # says nonce ...01
        f"pause.{jid}.g01.00000004": orjson.dumps({**good, "gen": 1, "nonce": "00000004"}),
        f"pause.{zero}.g1.00000005": orjson.dumps(
            {**good, "job": zero, "key": zero, "gen": 1, "nonce": "00000005"}
        ),
        f"priority.{jid}.g1.00000006": orjson.dumps({**good, "op": "priority", "gen": 1})
        + b" " * 5000,
        f"pause.{jid}.g1.00000007": orjson.dumps(
            {**good, "gen": 1, "nonce": "00000007", "placement": "../../.."}
        ),
    }
    for name, data in planted.items():
        (new / name).write_bytes(data)
    (new / f"pause.{jid}.g1.00000008").symlink_to(secret)
    os.mkfifo(new / f"pause.{jid}.g1.00000009")
    (new / f"pause.{jid}.g1.0000000a").mkdir()

    assert managers.run(flow.root) == 0
    assert flow.state("victim") == "succeeded"
    assert secret.read_text() == "keep me"
    assert sorted(os.listdir(new)) == []
    reasons = {r["name"]: (r["status"], r["reason"]) for r in flow.json("requests")["requests"]}
    assert reasons.pop(f"pause.{zero}.g1.00000005") == ("retired", "the job no longer exists")
    assert len(reasons) == 9  # the rest were unreadable: kept under bad.* names
    assert {s for s, _ in reasons.values()} == {"retired"}
    text = " | ".join(sorted(r for _, r in reasons.values()))
    for expected in (
        "is not a request name",
        "is not JSON",
        "says something other than its name",
        "is a symbolic link",
        "is not a regular file",
        "is larger than 4096 bytes",
    ):
        assert expected in text, text


def test_a_request_claimed_by_a_dead_manager_is_put_back_and_applied(flow: Flow) -> None:
    job = flow.submit("--tag", "j", "true")
    ws = Workspace.open(flow.root)
    name = request_for(flow.root, "j", "priority", priority=42)
    dead = Path(requests.claimed_dir(ws, "mdead"))
    dead.mkdir(parents=True)
    os.rename(Path(requests.new_dir(ws)) / name, dead / name)
    assert flow.json("requests")["requests"][0]["status"] == "claimed"
    # registration moves the job on: the request, made for submitted, applies to ready
    runner = Managers(Path(flow.root).parent)
    try:
        assert runner.run(flow.root, "--pool", "nowhere") == 0
    finally:
        runner.close()
    assert by_name(flow)[name]["status"] == "applied"
    assert flow.show("j")["priority"] == 42
    assert not dead.exists()
    del job


@pytest.mark.parametrize("point", ["request.after_claim", "request.after_apply"])
def test_a_manager_killed_while_sweeping_a_request_leaves_it_applied_exactly_once(
    flow: Flow, managers: Managers, point: str
) -> None:
    flow.submit("--tag", "j", "true")
    make_ready(flow, managers)
    name = request_for(flow.root, "j", "pause")
    first = managers.start(flow.root, "--pool", "nowhere", env={"FLOW_CRASH_AT": point})
    assert first.wait(30) == -signal.SIGKILL, log_of(first)
    assert managers.run(flow.root, "--pool", "nowhere") == 0
    assert flow.state("j") == "paused"
    assert len(applications(flow, "j", name)) == 1
    assert by_name(flow)[name]["status"] == "applied"
    assert claimed_left(flow.root) == []


def test_a_manager_killed_after_recording_a_folded_pause_leaves_it_applied_exactly_once(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    prog = write_script(scripts, "adv.sh", ADVANCE_ON_RELEASE)
    job = flow.submit("--tag", "j", prog)
    first = managers.start(
        flow.root, command="serve", workers=1, env={"FLOW_CRASH_AT": "commit.after_committing"}
    )
    run = flow.job_dir(job) / "run"
    wait_for(lambda: (run / "started").exists() or first.poll() is not None, 20)
    flow.ok("pause", "j")
    [req] = flow.json("requests")["requests"]
    (run / "release").touch()
    assert first.wait(30) == -signal.SIGKILL, log_of(first)
    assert claimed_left(flow.root), "the dead manager held the request"
    assert managers.run(flow.root) == 4  # stopped with the paused job left
    assert flow.state("j") == "paused"
    assert len(applications(flow, "j", str(req["name"]))) == 1
    assert by_name(flow)[str(req["name"])]["status"] == "applied"
    assert claimed_left(flow.root) == []


def test_gc_collects_old_retirement_records_and_never_a_pending_request(
    flow: Flow, managers: Managers
) -> None:
    flow.submit("--tag", "gone", "true")
    flow.submit("--tag", "kept", "true")
    make_ready(flow, managers)
    old = request_for(flow.root, "gone", "pause")
    assert managers.run(flow.root, "--pool", "nowhere") == 0  # applies it: a record in done/
    pending = request_for(flow.root, "kept", "priority", priority=1)
    ws = Workspace.open(flow.root)
    record = Path(requests.done_dir(ws)) / old
    os.utime(record, (1e9, 1e9))
    patch_policy(flow.root, keep_journal_days=1)
    doc = flow.json("gc")
    assert [i["kind"] for i in doc["collected"] if i["kind"] == "request_record"] == [
        "request_record"
    ]
    assert not record.exists()
    assert (Path(requests.new_dir(ws)) / pending).exists()


def test_requests_plain_and_json_outputs_are_whole_and_stable(
    flow: Flow, managers: Managers
) -> None:
    assert flow.ok("requests") == "no requests\n"
    job = flow.submit("--tag", "r", "true")
    make_ready(flow, managers)
    name = request_for(flow.root, "r", "priority", priority=7)
    key = job["key"]
    assert flow.ok("requests") == (
        f"STATUS   REQUEST     {'JOB'.ljust(len(key))}  GEN  MANAGER  REASON\n"
        f"pending  priority 7  {key}  1    -        -\n"
    )
    [doc] = flow.json("requests")["requests"]
    made, made_by = doc.pop("made"), doc.pop("made_by")
    assert isinstance(made, float) and made_by.startswith(f"cli-{os.getpid()}@")
    assert doc == {
        "name": name,
        "status": "pending",
        "op": "priority",
        "job": job["id"],
        "key": key,
        "gen": 1,
        "priority": 7,
        "manager": None,
        "reason": "",
        "at": None,
    }
