"""`flow submit --after` from the command line: what it refuses, whole error lines, and
what a dependent looks like before and after its dependency ends."""

from __future__ import annotations

import json
import subprocess
import sys

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
