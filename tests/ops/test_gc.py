"""`flow gc`: old attempts of finished jobs and unreachable journal segments go; the last
attempt, live attempts, persistent workdirs and every job's history stay."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
from helpers import wait_for
from manager.support import Managers, log_of

from httk_flow.ops import steering
from httk_flow.ops.gc import collect
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import locate_key
from httk_flow.protocol.workspace import Workspace

from .support import (
    SUCCEEDS_AT,
    Flow,
    patch_policy,
    wait_state,
    walk_while_moving,
    write_script,
)


def human(n: int) -> str:
    """How `flow gc` prints a size."""
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB"


def attempt_paths(flow: Flow, job: dict[str, str], name: str) -> set[str]:
    """What attempt `name` of a job left: its directory, or the output its commit's
    tidying moved up beside job.json (aNNNN.stdout, aNNNN.stderr)."""
    jdir = flow.job_dir(job)
    found = {str(p) for p in jdir.glob(f"{name}.std*")}
    if (jdir / name).is_dir():
        found.add(str(jdir / name))
    return found


def attempts(flow: Flow, job: dict[str, str]) -> list[str]:
    """The attempts that left files (one that printed nothing is tidied away)."""
    jdir = flow.job_dir(job)
    names = {p.name for p in jdir.glob("a*") if p.is_dir()}
    names |= {p.name.partition(".")[0] for p in jdir.glob("a*.std*")}
    return sorted(names)


def orphan_segment(root: str) -> Path:
    """A segment whose only frame no marker reaches (a crash between append and rename)."""
    seg = Path(root) / ".flow" / "journal" / "zz0rphan" / "0.jsonl"
    seg.parent.mkdir()
    seg.write_bytes(orjson.dumps({"job": "0" * 32, "to": "ready", "gen": 1}) + b"\n")
    return seg


@pytest.fixture
def expiring(flow: Flow) -> Flow:
    """The workspace keeps finished attempts and unreachable segments for 0 days."""
    patch_policy(flow.root, keep_attempts_days=0, keep_journal_days=0)
    return flow


def test_gc_keeps_the_last_attempt_live_attempts_workdirs_and_every_history(
    expiring: Flow, scripts: Path, managers: Managers
) -> None:
    flow = expiring
    prog = write_script(scripts, "succeeds-at.sh", SUCCEEDS_AT)
    three = flow.submit("--tag", "three", "--param", "ok=3", prog)  # fails twice, then succeeds
    once = flow.submit("--tag", "once", "true")
    slow = flow.submit("--tag", "slow", "--param", "ok=2", "--param", "block=1", prog)
    p = managers.start(flow.root, command="serve", workers=2)
    wait_state(flow, "three", {"succeeded"})
    wait_state(flow, "once", {"succeeded"})
    wait_for(lambda: (flow.job_dir(slow) / "run" / "started").exists() or p.poll(), 20)
    assert p.poll() is None, log_of(p)
    assert flow.state("slow") == "running"
    seg = orphan_segment(flow.root)
    assert attempts(flow, three) == ["a0001", "a0002", "a0003"]
    earlier = attempt_paths(flow, three, "a0001") | attempt_paths(flow, three, "a0002")
    assert len(earlier) >= 2, earlier
    expected = {("attempt", p) for p in earlier} | {("journal_segment", str(seg))}
    n_segments = len(list((Path(flow.root) / ".flow" / "journal").glob("*/*.jsonl")))

    dry = flow.json("gc", "--dry-run")
    assert set(dry) == {"dry_run", "bytes", "kept_segments", "misplaced", "collected"}
    assert dry["dry_run"] is True and dry["kept_segments"] == n_segments - 1
    assert dry["misplaced"] == 0
    assert {(i["kind"], i["path"]) for i in dry["collected"]} == expected
    assert dry["bytes"] == sum(i["bytes"] for i in dry["collected"]) > 0
    out = flow.ok("gc", "--dry-run").splitlines()
    assert sorted(out[:-1]) == sorted(
        f"would collect: {i['kind']} {i['path']} ({human(i['bytes'])})" for i in dry["collected"]
    )
    assert out[-1] == (
        f"would collect {len(expected)} item(s), {human(dry['bytes'])}; "
        f"kept {n_segments - 1} journal segment(s)"
    )
    assert attempts(flow, three) == ["a0001", "a0002", "a0003"] and seg.exists()

    done = flow.json("gc")
    assert done["dry_run"] is False
    assert {(i["kind"], i["path"]) for i in done["collected"]} == expected
    assert attempts(flow, three) == ["a0003"]
    assert (flow.job_dir(three) / "run" / "count").read_text() == "3\n"
    assert attempts(flow, once) == [], "it printed nothing: tidied away at its commit"
    assert flow.ok("logs", "once") == ""
    assert attempts(flow, slow) == ["a0001", "a0002"], "a running job is never collected"
    assert (flow.job_dir(slow) / "run" / "started").exists()
    assert not seg.parent.exists()
    assert flow.ok("logs", "three") == "out 3\n"

    (flow.job_dir(slow) / "run" / "release").touch()
    wait_state(flow, "slow", {"succeeded"})
    p.terminate()
    assert p.wait(10) == 0, log_of(p)
    for job in (three, once, slow):
        frames = flow.history(job["key"])
        assert frames[0]["to"] == "submitted" and frames[-1]["to"] == "succeeded"
        assert [f["gen"] for f in frames] == list(range(len(frames)))
    assert flow("fsck").exit_code == 0

    [manager] = flow.json("managers", "--all")["managers"]
    slow_first = attempt_paths(flow, slow, "a0001")
    assert slow_first, "its first attempt failed with output"
    again = flow.json("gc")
    assert {(i["kind"], i["path"]) for i in again["collected"]} == {
        ("attempt", p) for p in slow_first
    } | {("manager", str(Path(flow.root) / ".flow" / "managers" / manager["id"]))}
    assert flow("fsck").exit_code == 0


def test_gc_with_the_default_policy_keeps_a_fresh_workspace_whole(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    prog = write_script(scripts, "succeeds-at.sh", SUCCEEDS_AT)
    job = flow.submit("--param", "ok=2", prog)
    assert managers.run(flow.root) == 0
    out = flow.ok("gc")
    assert re.fullmatch(r"collected 0 item\(s\), 0 B; kept \d+ journal segment\(s\)\n", out)
    assert attempts(flow, job) == ["a0001", "a0002"]


def test_gc_keeps_the_history_of_a_job_resumed_while_it_walks(
    expiring: Flow, managers: Managers
) -> None:
    flow = expiring
    job = flow.submit("--tag", "resumed", "--retries", "0", "false")
    assert managers.run(flow.root) == 1

    def resume(ws: Workspace) -> None:
        h = locate_key(ws, job["placement"], job["key"])
        assert h is not None and h.state is State.FAILED
        steering.resume(ws, h)

    # gc's reachability walk has listed the ready jobs when the job is resumed into them
    walk_while_moving(
        flow.root,
        "httk_flow.protocol.discovery.MarkerStream",
        State.READY,
        resume,
        lambda ws: collect(ws, dry_run=False),
    )
    r = flow("history", "resumed", "--json")
    assert r.exit_code == 0, r.output
    frames = orjson.loads(r.stdout)["transitions"]
    steps = ["submitted", "ready", "claimed", "running", "committing", "failed", "ready"]
    assert [f["to"] for f in frames] == steps


def test_gc_collects_attempts_of_earlier_revisions_never_through_a_link(
    expiring: Flow, managers: Managers, tmp_path: Path
) -> None:
    """attempts/aNNNN/ (where managers before protocol revision 6 made attempt directories)
    is collected as aNNNN/ is, the last attempt kept; an attempts/ that is a symbolic link
    is not the job's, and nothing it points to is collected."""
    flow = expiring
    old = flow.submit("--tag", "old", "true")
    linked = flow.submit("--tag", "linked", "true")
    assert managers.run(flow.root) == 0
    outside = tmp_path / "outside"
    for base in (flow.job_dir(old) / "attempts", outside):
        for n in ("a0001", "a0002"):
            (base / n).mkdir(parents=True)
            (base / n / "stdout").write_text(f"{n}\n")
    (flow.job_dir(linked) / "attempts").symlink_to(outside)
    done = flow.json("gc")
    assert [i["path"] for i in done["collected"] if i["kind"] == "attempt"] == [
        str(flow.job_dir(old) / "attempts" / "a0001")
    ]
    assert (flow.job_dir(old) / "attempts" / "a0002" / "stdout").read_text() == "a0002\n"
    assert sorted(p.name for p in outside.iterdir()) == ["a0001", "a0002"]
    assert (outside / "a0001" / "stdout").read_text() == "a0001\n"
