"""A workspace written by an older commit is read and finished by the code of this checkout.

tests/fixtures/workspace-45b773a.tar.gz was written by commit 45b773a (the code before the
restructure into typed journal frames) with tests/fixtures/make_old_workspace.py, whose
docstring lists the scene: jobs finished, failed, cancelled, paused, waiting on a join, ready
with retries used or a backoff, at another priority, and jobs held by managers that were
SIGKILLed (claimed, running, committing, one with its outcome published), with a pause
request waiting for one of them. Every manager of it ran as host old-node-45b773a.

The test goes through the public CLI and the files on disk only (no httk_flow import), so
it holds whatever the package's modules become: the on-disk format is the contract.
"""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"
FIXTURE = FIXTURES / "workspace-45b773a.tar.gz"
OLD_HOST = "old-node-45b773a"

#: every job of the fixture by tag, as the old code left it (its generator checked it did)
BEFORE: dict[str, str] = runpy.run_path(str(FIXTURES / "make_old_workspace.py"))["SCENE"]
#: the jobs an old manager held when it was killed: fsck may call their owners dead
HELD = {"claimed", "launched", "committed", "published"}

#: what each job's program wrote in $FLOW_JOB_DIR/runs once everything is finished: one
#: line per start, "<attempt> <step> <FLOW_UNCLEAN_RESTART>"
RUNS = {
    "steps": ["a0001 main 0", "a0002 two 0", "a0003 three 0"],
    "bad": ["a0001 bad 0"],
    "fixme": ["a0001 bad 0", "a0002 fixed 0"],
    "fan": ["a0001 spawn 0", "a0002 collect 0"],
    "kid1": ["a0001 child 0"],
    # the drain of the old manager stopped their first attempts: the next is unclean
    "kid2": ["a0001 child 0", "a0002 child 1"],
    "kid3": ["a0001 child 0", "a0002 child 1"],
    "flaky": ["a0001 flaky 0", "a0002 flaky 0", "a0003 flaky 1"],
    "urgent": ["a0001 plain 0"],
    "held": ["a0001 plain 0"],
    # released from its dead owner before it ever started
    "claimed": ["a0002 plain 0"],
    # a0001 never ran its program (its manager died before opening the gate); a0002 runs
    # after `flow resume`, a new activation: not a restart of anything
    "launched": ["a0002 plain 0"],
    # committed and published: the old attempt's outcome is committed, never rerun
    "committed": ["a0001 plain 0"],
    "published": ["a0001 publish 0"],
    "retry": ["a0001 retry 0", "a0002 retry 0"],
}


def flow(root: Path, *args: str, codes: tuple[int, ...] = (0,)) -> str:
    """`python -m httk_flow -w ROOT ARGS`; its stdout (the exit status must be in `codes`)."""
    r = subprocess.run(
        [sys.executable, "-m", "httk_flow", "-w", str(root), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode in codes, f"flow {' '.join(args)}: {r.returncode}\n{r.stdout}{r.stderr}"
    return r.stdout


def flow_json(root: Path, *args: str, codes: tuple[int, ...] = (0,)) -> Any:
    return json.loads(flow(root, *args, "--json", codes=codes))


def listing(root: Path) -> dict[str, dict[str, Any]]:
    """`flow list --json` by tag (every job of the fixture has a tag of its own)."""
    return {j["tag"]: j for j in flow_json(root, "list")["jobs"]}


def history(root: Path, ident: str) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = flow_json(root, "history", ident)["transitions"]
    return frames


def runs(root: Path, job: dict[str, Any]) -> list[str]:
    path = root / job["placement"] / job["key"] / "runs"
    return path.read_text().splitlines() if path.exists() else []


def extract(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    with tarfile.open(FIXTURE) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(tmp_path, filter="data")
        else:  # pragma: no cover - Pythons before 3.11.4
            tar.extractall(tmp_path)
    meta: dict[str, Any] = json.loads((tmp_path / "FIXTURE.json").read_text())
    return tmp_path / "ws", meta


def test_the_fixture_is_small_and_names_its_birthplace_only_in_records(tmp_path: Path) -> None:
    assert FIXTURE.stat().st_size < 64 * 1024
    root, meta = extract(tmp_path)
    old = meta["generation_directory"].encode()
    assert meta["commit"] == "45b773a" and str(root) != meta["generation_directory"]
    named = sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and old in p.read_bytes()
    )
    # the old root survives only where what happened is recorded: the attempt's directory
    # in the frames that launched it (attempt.dir) and the attempt's own context.json;
    # nothing a manager decides by (markers, job.json, heartbeats, requests, format.json)
    assert named, "the fixture was expected to record where its attempts ran"
    for name in named:
        parts = Path(name).parts
        journal = parts[:2] == (".flow", "journal") and name.endswith(".jsonl")
        context = len(parts) > 2 and parts[-3] == "attempts" and parts[-1] == "context.json"
        assert journal or context, f"{name} names the directory the fixture was made in"


def test_a_workspace_written_by_45b773a_is_read_and_finished_by_this_code(
    tmp_path: Path,
) -> None:
    root, meta = extract(tmp_path)
    made = float(meta["at"])  # when the fixture was packed, on its maker's clock

    # -- read as it is -------------------------------------------------------------------
    report = flow_json(root, "fsck", codes=(0, 1))
    assert (report["markers"], report["payloads"]) == (16, 16), report
    # a one-shot reader cannot tell the old managers alive or dead until their heartbeats
    # (re-stamped by the extraction) age past a lease: their held jobs may be reported
    for problem in report["problems"]:
        assert problem["kind"] == "dead_owner", report
        assert any(problem["object"].startswith(f"job {t}--") for t in HELD), report
    assert report["clean"] == (not report["problems"]), report

    status = flow_json(root, "status")
    counts = {k: v for k, v in status["counts"].items() if v}
    want: dict[str, int] = {}
    for st in BEFORE.values():
        want[st] = want.get(st, 0) + 1
    assert counts == want, status
    assert status["total"] == 16
    assert status["requests_pending"] == 1, status  # the pause of `launched`
    assert {m["host"] for m in status["managers"]} <= {OLD_HOST}, status

    jobs = listing(root)
    assert {t: j["state"] for t, j in jobs.items()} == BEFORE
    assert jobs["urgent"]["priority"] == 900 and jobs["held"]["priority"] == 700
    assert jobs["fan"]["step"] == "spawn" and jobs["kid2"]["step"] == "child"

    bad = flow_json(root, "show", "bad")
    assert bad["state"] == "failed" and bad["directory"] == str(
        root / bad["placement"] / bad["key"]
    )
    assert bad["failure"]["code"] == "bad_input", bad
    assert bad["failure"]["message"] == f"no input deck for {bad['key']}", bad
    [attempt] = bad["attempts"]
    assert attempt["result"]["outcome"]["action"] == "fail", attempt
    assert attempt["host"] == OLD_HOST

    steps = flow_json(root, "show", "steps")
    assert (steps["state"], steps["step"], steps["activation"]) == ("succeeded", "three", 3)
    assert [a["result"]["outcome"]["action"] for a in steps["attempts"]] == [
        "advance",
        "advance",
        "succeed",
    ]
    assert flow(root, "logs", "steps", "--attempt", "2") == "a0002 two\n"

    flaky = flow_json(root, "show", "flaky")
    assert flaky["state"] == "ready" and "not_before" not in flaky, flaky
    assert [a["result"] for a in flaky["attempts"]] == [
        {"exit": 3, "signal": None},
        {"exit": None, "signal": 15, "interrupted": "drain"},
    ]
    last = history(root, "flaky")[-1]
    assert (last["try"], last["tries"], last["last"]) == (1, 2, "interrupted"), last

    retry = flow_json(root, "show", "retry")
    assert retry["state"] == "ready" and retry["not_before"] <= made, retry

    held = flow_json(root, "show", "held")
    assert (held["state"], held["priority"], held["definition"]["pool"]) == ("paused", 700, "later")

    committed = history(root, "committed")[-1]
    assert (committed["to"], committed["decision"]["target"]) == ("committing", "succeeded")
    published = flow_json(root, "show", "published")
    [attempt] = published["attempts"]
    assert (published["state"], attempt["host"]) == ("running", OLD_HOST), published
    outcome = root / published["placement"] / published["key"] / "attempts" / "a0001"
    assert (outcome / "outcome.ready" / "outcome.json").is_file()
    claimed = flow_json(root, "show", "claimed")
    assert claimed["attempts"][0]["host"] == OLD_HOST and claimed["state"] == "claimed"

    gone = history(root, "gone")
    assert [(f.get("from"), f["to"]) for f in gone] == [
        (None, "submitted"),
        ("submitted", "cancelled"),
    ]
    assert gone[-1]["reason"] == "submitted by mistake"

    old = {t: history(root, t) for t in ("steps", "fan", "flaky", "kid2", "committed", "published")}
    for tag, frames in old.items():
        assert [f["gen"] for f in frames] == list(range(len(frames))), tag
        assert frames[0]["prev"] is None and all(f["prev"] for f in frames[1:]), tag
        assert all(f["t"] <= made for f in frames), tag

    # -- finished by this code -----------------------------------------------------------
    if retry["not_before"] > time.time():
        # made on a machine whose clock was ahead of this one's: the backoff in the marker
        # holds until then (the filesystem's clock decides, by design), so a new activation
        # takes its place; its next start is a0002 at the same step all the same
        flow(root, "pause", "retry")
        flow(root, "resume", "retry")
    flow(root, "resume", "held")
    flow(root, "resume", "fixme", "--step", "fixed")
    # serves the default pool and `later`; takes over the four jobs of the dead managers
    # once their heartbeats are seen silent for a lease (they were on another host); it
    # stops with `launched` paused, work left it could not do: exit status 4
    flow(
        root, "run", "--pool", "default", "--pool", "later", "--workers", "4", "--quiet", codes=(4,)
    )
    jobs = listing(root)
    # the pause request the old CLI left applied when `launched` was taken over
    assert jobs["launched"]["state"] == "paused", jobs["launched"]
    assert flow_json(root, "status")["requests_pending"] == 0
    flow(root, "resume", "launched")
    flow(root, "run", "--pool", "default", "--pool", "later", "--workers", "4", "--quiet")

    jobs = listing(root)
    final = {t: "succeeded" for t in BEFORE} | {"bad": "failed", "gone": "cancelled"}
    assert {t: j["state"] for t, j in jobs.items()} == final
    assert {t: runs(root, j) for t, j in jobs.items() if t != "gone"} == RUNS
    assert not runs(root, jobs["gone"])

    def result(tag: str) -> str:
        return (root / jobs[tag]["placement"] / jobs[tag]["key"] / "result").read_text()

    assert result("steps") == "main\ntwo\nthree\n"
    assert result("fan") == "c1 succeeded 1\nc2 succeeded 4\nc3 succeeded 9\n"
    assert [result(t) for t in ("fixme", "flaky", "published", "retry")] == [
        "fixed\n",
        "flaky\n",
        "published\n",
        "retry\n",
    ]
    fan = history(root, "fan")
    assert fan[-1]["message"] == "sum of squares 14"
    assert fan[-1]["act"] == 2 and fan[-1]["step"] == "collect"

    # the dead managers' work was taken over on the evidence of their silent leases
    for tag in HELD:
        evidence = [f["evidence"] for f in history(root, tag) if "evidence" in f]
        assert evidence, tag
        assert {e["evidence"] for e in evidence} == {"lease_expired"}, (tag, evidence)
    published = flow_json(root, "show", "published")
    assert [a["id"] for a in published["attempts"]] == ["a0001"], published
    assert published["attempts"][0]["result"]["outcome"]["action"] == "succeed"

    # the old frames read the same, now followed by the new ones
    for tag, frames in old.items():
        now = history(root, tag)
        assert now[: len(frames)] == frames, tag
        assert [f["gen"] for f in now] == list(range(len(now))), tag
    assert flow_json(root, "fsck")["clean"]
