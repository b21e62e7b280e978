"""Steering through the CLI: cancel, pause, resume and priority, with and without a manager."""

from __future__ import annotations

from pathlib import Path

from helpers import wait_for
from manager.support import Managers, log_of

from .support import (
    ADVANCE_ON_RELEASE,
    BROKEN_MAIN,
    Flow,
    live_processes,
    serve_until_started,
    wait_state,
    write_script,
)

#: a job with a child in the background and one in the foreground, both sleeping
SLEEPERS = """#!/bin/sh
sleep 300 &
echo $! > "$FLOW_WORKDIR/child.pid"
echo $$ > "$FLOW_WORKDIR/main.pid"
touch "$FLOW_WORKDIR/started"
sleep 300
"""


def make_ready(flow: Flow, managers: Managers) -> None:
    """Register every submitted job with a manager that serves none of them, then exits."""
    assert managers.run(flow.root, "--pool", "nowhere") == 0


def test_cancelling_a_running_job_stops_its_whole_process_group(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    sleepers = write_script(scripts, "sleepers.sh", SLEEPERS)
    job, p, run = serve_until_started(flow, managers, "--tag", "sleepy", sleepers)
    [running] = [f for f in flow.history("sleepy") if f["to"] == "running"]
    pgid = running["attempt"]["pgid"]
    pids = {int((run / f).read_text()) for f in ("main.pid", "child.pid")}
    # "started" is written before the foreground sleep begins: wait for all three
    wait_for(lambda: len(live_processes(pgid=pgid)) == 3, 10)
    group = set(live_processes(pgid=pgid))
    assert pids < group and len(group) == 3, "sh, its background and its foreground sleep"

    out = flow.ok("cancel", "sleepy", "--reason", "enough")
    assert out == f"{job['key']}: running -> cancelling (its manager stops the process group)\n"
    wait_state(flow, "sleepy", {"cancelled"})
    assert live_processes(pgid=pgid) == [] and live_processes(pids=group) == []
    frames = flow.history("sleepy")
    assert [f["to"] for f in frames[-2:]] == ["cancelling", "cancelled"]
    assert frames[-2]["reason"] == "enough"
    assert "verified" in frames[-1]["evidence"] and frames[-1]["evidence"]["group_gone"]
    assert p.poll() is None, "the manager serves on after a cancellation"
    p.terminate()
    assert p.wait(10) == 0, log_of(p)


def test_queued_jobs_are_cancelled_by_the_cli_alone(flow: Flow, managers: Managers) -> None:
    ready = flow.submit("--tag", "r", "true")
    make_ready(flow, managers)
    submitted = flow.submit("--tag", "s", "true")
    assert flow.json("managers")["managers"] == []
    out = flow.ok("cancel", "s", "r", "--reason", "not needed")
    assert out == (
        f"{submitted['key']}: submitted -> cancelled\n{ready['key']}: ready -> cancelled\n"
    )
    for tag in ("r", "s"):
        last = flow.history(tag)[-1]
        assert (last["to"], last["why"], last["reason"]) == ("cancelled", "cancelled", "not needed")
        assert last["by"].startswith("cli-")
    r = flow("cancel", "r")
    assert (r.exit_code, r.stdout) == (
        0,
        f"{ready['key']}: cancelled -> cancelled (already cancelled)\n",
    )


def test_cancel_by_state_cancels_every_ready_job_and_nothing_else(
    flow: Flow, managers: Managers
) -> None:
    ready = [flow.submit("--tag", f"r{i}", "true") for i in range(3)]
    make_ready(flow, managers)
    submitted = flow.submit("--tag", "s", "true")
    out = flow.ok("cancel", "--state", "ready", "--yes")
    assert sorted(out.splitlines()) == sorted(f"{j['key']}: ready -> cancelled" for j in ready)
    states = {j["key"]: j["state"] for j in flow.json("list")["jobs"]}
    assert states == {**{j["key"]: "cancelled" for j in ready}, submitted["key"]: "submitted"}


def test_naming_jobs_and_a_state_together_selects_both(flow: Flow) -> None:
    job = flow.submit("--tag", "s", "true")
    r = flow("cancel", "s", "--state", "ready")
    assert (r.exit_code, r.stderr) == (
        2,
        "flow: error: job 's': matches no job with --state ready; see the jobs with `flow list`\n",
    )
    r = flow("cancel", "s", "--state", "submitted")
    assert (r.exit_code, r.stdout) == (0, f"{job['key']}: submitted -> cancelled\n")


def test_a_paused_ready_job_resumes_and_runs_to_success(flow: Flow, managers: Managers) -> None:
    job = flow.submit("--tag", "p", "true")
    make_ready(flow, managers)
    assert flow.ok("pause", "p") == f"{job['key']}: ready -> paused\n"
    assert flow.json("list", "--state", "paused")["jobs"][0]["key"] == job["key"]
    assert managers.run(flow.root) == 4  # stopped with paused work left
    assert flow.state("p") == "paused", "a manager leaves a paused job alone"
    assert flow.ok("resume", "p") == f"{job['key']}: paused -> ready\n"
    assert managers.run(flow.root) == 0
    assert flow.state("p") == "succeeded"


def test_a_running_job_pauses_when_its_attempt_ends_and_resumes_at_its_next_step(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    adv = write_script(scripts, "adv.sh", ADVANCE_ON_RELEASE)
    job, p, run = serve_until_started(flow, managers, "--tag", "pausing", adv)
    assert flow.ok("pause", "pausing") == (
        f"{job['key']}: running -> running (pauses when its current attempt ends)\n"
    )
    (run / "release").touch()
    assert wait_state(flow, "pausing", {"paused", "succeeded", "failed"}) == "paused"
    last = flow.history("pausing")[-1]
    assert (last["from"], last["step"]) == ("committing", "two")
    [req] = flow.json("requests")["requests"]
    assert (req["op"], req["key"], req["status"]) == ("pause", job["key"], "applied")
    assert flow.json("requests", "--pending")["requests"] == []

    assert flow.ok("resume", "pausing") == f"{job['key']}: paused -> ready\n"
    wait_state(flow, "pausing", {"succeeded"})
    assert [a["step"] for a in flow.show("pausing")["attempts"]] == ["main", "two"]
    p.terminate()
    assert p.wait(10) == 0, log_of(p)


def test_a_failed_job_resumed_at_another_step_succeeds_there(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    job = flow.submit("--tag", "broken", write_script(scripts, "broken.sh", BROKEN_MAIN))
    assert managers.run(flow.root) == 1
    shown = flow.show("broken")
    assert (shown["state"], shown["failure"]["code"]) == ("failed", "broken")
    assert flow.ok("resume", "broken", "--step", "fix") == f"{job['key']}: failed -> ready\n"
    assert flow.show("broken")["step"] == "fix"
    assert managers.run(flow.root) == 0
    shown = flow.show("broken")
    assert (shown["state"], shown["step"]) == ("succeeded", "fix")
    assert [a["step"] for a in shown["attempts"]] == ["main", "fix"]


def test_resuming_a_job_that_is_neither_paused_nor_failed_is_refused(flow: Flow) -> None:
    job = flow.submit("--tag", "s", "true")
    r = flow("resume", "s")
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr == (
        f"flow: error: job {job['key']}: is submitted; only paused or failed jobs can be resumed\n"
    )


def test_priority_changes_the_marker_and_a_one_worker_manager_claims_by_it(
    flow: Flow, managers: Managers
) -> None:
    jobs = {t: flow.submit("--tag", t, "true") for t in ("a", "b", "c", "d")}
    make_ready(flow, managers)
    assert flow.ok("priority", "a", "100") == f"{jobs['a']['key']}: ready -> ready (priority 100)\n"
    out = flow.ok("priority", "b", "d", "900")
    assert out == "".join(f"{jobs[t]['key']}: ready -> ready (priority 900)\n" for t in "bd")
    flow.ok("priority", "d", "700")
    rows = {r["tag"]: r["priority"] for r in flow.json("list")["jobs"]}
    assert rows == {"a": 100, "b": 900, "c": 500, "d": 700}
    assert flow.marker(jobs["d"]).name.split(".")[1] == "p700"

    assert managers.run(flow.root, workers=1) == 0
    # the order they ran in: one worker runs one at a time, each start a program's run
    # after the last (a job launched ahead is claimed within a millisecond of another)
    started = {
        t: next(f["t"] for f in flow.history(t) if f["to"] == "running")
        for t in ("a", "b", "c", "d")
    }
    assert sorted(started, key=started.__getitem__) == ["b", "d", "c", "a"]


def test_priority_of_a_submitted_job_applies_before_registration(flow: Flow) -> None:
    job = flow.submit("--tag", "s", "true")
    r = flow("priority", "s", "7")
    assert (r.exit_code, r.stdout) == (0, f"{job['key']}: submitted -> submitted (priority 7)\n")
    assert flow.marker(job).name.split(".")[1] == "p007"


def test_a_priority_out_of_range_is_bad_input_refused_once_with_exit_2(
    flow: Flow, managers: Managers
) -> None:
    for t in ("a", "b"):
        flow.submit("--tag", t, "true")
    make_ready(flow, managers)
    r = flow("priority", "a", "b", "1000")
    assert r.exit_code == 2 and r.stdout == ""
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("flow: error: ")
    assert {j["priority"] for j in flow.json("list")["jobs"]} == {500}


def test_resuming_at_a_step_name_off_the_grammar_is_bad_input_with_exit_2(
    flow: Flow, managers: Managers
) -> None:
    flow.submit("--tag", "f", "--retries", "0", "false")
    assert managers.run(flow.root) == 1
    r = flow("resume", "f", "--step", "bad-step")
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.startswith("flow: error: step name 'bad-step': ")
    assert flow.state("f") == "failed"


def test_bulk_pause_resume_and_priority_act_on_every_job_of_a_state(
    flow: Flow, managers: Managers
) -> None:
    keys = {t: flow.submit("--tag", t, "true")["key"] for t in ("a", "b", "c")}
    make_ready(flow, managers)
    out = flow.ok("pause", "--state", "ready", "--yes")
    assert sorted(out.splitlines()) == sorted(f"{k}: ready -> paused" for k in keys.values())
    out = flow.ok("priority", "--state", "paused", "42", "--yes")
    assert sorted(out.splitlines()) == sorted(
        f"{k}: paused -> paused (priority 42)" for k in keys.values()
    )
    out = flow.ok("resume", "--all", "--yes")
    assert sorted(out.splitlines()) == sorted(f"{k}: paused -> ready" for k in keys.values())
    assert {r["priority"] for r in flow.json("list")["jobs"]} == {42}
    r = flow("pause", "a", "--state", "paused")
    assert (r.exit_code, r.stderr) == (
        2,
        "flow: error: job 'a': matches no job with --state paused; see the jobs with `flow list`\n",
    )
    r = flow("priority", "7")
    assert (r.exit_code, r.stderr) == (
        2,
        "flow: error: flow priority: expects JOB... N with N in 0-999\n",
    )
    assert managers.run(flow.root) == 0
    out = flow.ok("priority", "--all", "9", "--yes")
    assert out == "", "finished jobs are skipped, not refused"
