"""`flow show` and `flow history` in text carry what the JSON has: the job's last
message, its retry budget, a waiting parent's join progress, why attempts ended."""

from __future__ import annotations

from pathlib import Path

from helpers import wait_for
from manager.support import Managers, log_of

from .support import Flow, write_script

#: a parent that spawns three children and waits; each child waits for a release file
FAMILY = """#!/usr/bin/env bash
source "$FLOW_BASH_API"
flow_steps main point collect
step_main() {
    local i
    for i in 1 2 3; do flow_spawn --label "c$i" --step point; done
    flow_wait collect --all-succeeded
}
step_point() {
    until [ -e "$FLOW_WORKSPACE_DIR/release" ]; do sleep 0.05; done
    flow_succeed "point done"
}
step_collect() { flow_succeed "collected $(flow_children | wc -l) points"; }
flow_main "$@"
"""


def _field(text: str, name: str) -> str:
    [line] = [ln for ln in text.splitlines() if ln.split("  ")[0].strip() == name]
    return line.split("  ", 1)[1].strip()


def test_a_waiting_parent_shows_its_join_and_the_end_its_message(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    parent = flow.submit("--tag", "fam", "--retries", "3", write_script(scripts, "f.sh", FAMILY))
    # none launched ahead: a child waiting claimed at its gate would be counted so
    p = managers.start(flow.root, "--no-launch-ahead", command="serve", workers=1)
    # one child runs (and waits), two wait for the one worker
    wait_for(
        lambda: flow.show("fam").get("join", {}).get("running") == 1 or p.poll() is not None, 30
    )
    assert p.poll() is None, log_of(p)
    doc = flow.show("fam")
    assert doc["join"] == {
        "mode": "all_succeeded",
        "next": "collect",
        "children": 3,
        "running": 1,
        "ready": 2,
    }
    text = flow.ok("show", "fam")
    assert _field(text, "join") == "3 children, all_succeeded: 2 ready, 1 running; then collect"
    assert _field(text, "retries") == "3 per activation; 0 of at most 100 failures charged"

    (Path(flow.root) / "release").touch()
    wait_for(lambda: flow.state("fam") == "succeeded" or p.poll() is not None, 60)
    assert p.poll() is None, log_of(p)
    text = flow.ok("show", "fam")
    assert _field(text, "message") == "collected 3 points"
    assert "join" not in flow.show("fam")
    assert _field(text, "key") == parent["key"]
    p.terminate()
    assert p.wait(10) == 0, log_of(p)


def test_history_says_a_drain_apart_from_the_job_s_own_end(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    flow.submit(
        "--tag",
        "long",
        write_script(scripts, "s.sh", '#!/bin/sh\ntouch "$FLOW_WORKDIR/up"\nexec sleep 300\n'),
    )
    p = managers.start(flow.root, command="serve", workers=1)
    wait_for(lambda: flow.state("long") == "running" or p.poll() is not None, 30)
    run = Path(flow.root)
    wait_for(lambda: any(run.rglob("up")) or p.poll() is not None, 30)
    p.terminate()  # the first TERM drains: the attempt is stopped and handed back
    assert p.wait(30) == 0, log_of(p)
    assert flow.state("long") == "ready"
    rows = [ln for ln in flow.ok("history", "long").splitlines() if " committing " in ln]
    assert rows and rows[-1].endswith("interrupted; drained by its manager"), rows
