"""`flow submit --after` from the command line: what it refuses, whole error lines, and
what a dependent looks like before and after its dependency ends."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FLOW = [sys.executable, "-m", "httk_flow"]


def flow(ws: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FLOW, "-w", ws, *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_a_dependency_on_no_job_is_refused_and_nothing_is_submitted(ws: str) -> None:
    r = flow(ws, "submit", "--after", "0123456789abcdef", "true")
    assert r.returncode == 2
    assert r.stderr == (
        "flow: error: --after '0123456789abcdef': matches no job; see the jobs with `flow list`\n"
    )
    r = flow(ws, "submit", "--after", "tag:nosuch", "true")
    assert r.returncode == 2
    assert "--after 'tag:nosuch': matches no job" in r.stderr
    r = flow(ws, "submit", "--after", "what is this", "true")
    assert r.returncode == 2
    assert r.stderr.startswith("flow: error: --after 'what is this': ")
    assert json.loads(flow(ws, "list", "--json").stdout) == {"jobs": []}


def test_an_unknown_policy_is_refused_with_the_choices(ws: str) -> None:
    first = flow(ws, "submit", "true").stdout.strip()
    r = flow(ws, "submit", "--after", first, "--after-policy", "sometimes", "true")
    assert r.returncode == 2
    assert "'sometimes' is not one of 'ok', 'any', 'fail', 'wait'" in r.stderr


def test_a_dependent_waits_with_its_reason_and_runs_after_its_dependency(ws: str) -> None:
    first = flow(ws, "submit", "--tag", "first", "true").stdout.strip()
    second = flow(ws, "submit", "--after", "tag:first", "--after", first, "true").stdout.strip()
    assert len(second) == 32
    r = flow(ws, "run")
    assert r.returncode == 0, r.stderr
    jobs = json.loads(flow(ws, "list", "--json").stdout)["jobs"]
    states = {j["id"]: j["state"] for j in jobs}
    assert states == {first: "succeeded", second: "succeeded"}


def test_an_array_after_a_tag_names_its_sets_after_the_batch_and_a_rerun_adds_nothing(
    ws: str,
) -> None:
    flow(ws, "submit", "--tag", "first", "true")
    r = flow(ws, "submit", "--after", "tag:first", "--array", "1-5", "--json", "true")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["submitted"] == 5
    sets = {
        a["set"]
        for j in doc["jobs"]
        for a in json.loads((Path(ws) / j["placement"] / j["key"] / "job.json").read_text())[
            "after"
        ]
    }
    [set_id] = sets
    assert set_id != "0" * 20 and (Path(ws) / ".flow" / "after" / set_id / "set.json").exists()
    again = flow(ws, "submit", "--after", "tag:first", "--array", "1-5", "true")
    assert again.returncode == 0
    assert "all 5 jobs were submitted already; nothing new" in again.stderr
    assert sorted(p.name for p in (Path(ws) / ".flow" / "after").iterdir()) == [set_id]
    other = flow(
        ws, "submit", "--after", "tag:first", "--after-policy", "any", "--array", "1-5", "true"
    )
    assert other.returncode == 0 and "nothing new" not in other.stderr


def test_waiting_for_its_own_group_is_refused_as_a_cycle(ws: str) -> None:
    flow(ws, "submit", "--group", "relax", "true")
    r = flow(ws, "submit", "--group", "relax", "--after", "group:relax", "true")
    assert r.returncode == 2
    assert r.stderr == (
        "flow: error: --after 'group:relax': names the group these jobs join: a job cannot "
        "wait for itself; give the new jobs another --group\n"
    )


def test_a_dependent_paused_while_waiting_is_ready_on_resume_once_its_dependency_ended(
    ws: str,
) -> None:
    first = flow(ws, "submit", "--hold", "--group", "relax", "true").stdout.strip()
    held = flow(ws, "submit", "--hold", "--after", "group:relax", "true").stdout.strip()
    second = flow(ws, "submit", "--after", "group:relax", "true").stdout.strip()
    assert flow(ws, "run").returncode == 4  # held and waiting jobs are left
    shown = flow(ws, "show", second).stdout
    assert "\nafter       group:relax (ok): 0 of 1 ended\n" in shown
    listed = flow(ws, "list", "--state", "waiting").stdout.splitlines()
    assert listed[0].split()[6] == "REASON" and listed[1].split()[6] == "after", listed
    assert json.loads(flow(ws, "list", "--json", second).stdout)["jobs"][0]["after"] is True
    status = flow(ws, "status").stdout
    assert "blocked: 1 job: waiting for dependencies that have not ended" in status
    assert flow(ws, "pause", second).returncode == 0
    assert flow(ws, "release", "--group", "relax").returncode == 0
    assert flow(ws, "run").returncode == 4  # the two paused dependents are left
    jobs = {j["id"]: j["state"] for j in json.loads(flow(ws, "list", "--json").stdout)["jobs"]}
    assert jobs == {first: "succeeded", held: "paused", second: "paused"}
    # their sets were met while they were paused: a resume makes them ready, not waiting
    r = flow(ws, "resume", second, held, "--json")
    assert r.returncode == 0, r.stderr
    assert flow(ws, "run").returncode == 0
    jobs = {j["id"]: j["state"] for j in json.loads(flow(ws, "list", "--json").stdout)["jobs"]}
    assert set(jobs.values()) == {"succeeded"}
    doc = json.loads(flow(ws, "show", held, "--json").stdout)
    [dep] = doc["after"]
    assert (dep["selector"], dep["policy"], dep["members"], dep["complete"]) == (
        "group:relax",
        "ok",
        1,
        True,
    )
    assert dep["ended"] == {"succeeded": 1}


def test_cancelling_a_dependency_cancels_its_dependents_with_the_reason(ws: str) -> None:
    first = flow(ws, "submit", "--hold", "true").stdout.strip()
    second = flow(ws, "submit", "--after", first, "true").stdout.strip()
    anyway = flow(ws, "submit", "--after", first, "--after-policy", "any", "true").stdout.strip()
    assert flow(ws, "run").returncode == 4
    assert flow(ws, "cancel", first).returncode == 0
    doc = json.loads(flow(ws, "show", second, "--json").stdout)
    assert doc["state"] == "cancelled"
    assert flow(ws, "run").returncode == 0
    assert json.loads(flow(ws, "show", anyway, "--json").stdout)["state"] == "succeeded"
