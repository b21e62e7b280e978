"""`flow list` after real attempts: start, end and a failure-reason column, chosen
columns with --format, and the --failed-code and --interrupted filters."""

from __future__ import annotations

from pathlib import Path

import orjson
from manager.support import Managers

from .support import Flow, write_script


def test_list_shows_why_rows_failed_and_filters_by_code(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    ok = write_script(scripts, "ok.sh", "#!/bin/sh\nexit 0\n")
    bad = write_script(
        scripts,
        "bad.sh",
        '#!/usr/bin/env bash\nsource "$FLOW_BASH_API"\nflow_fail "no input" bad_input\n',
    )
    flow.submit("--tag", "good", ok)
    flow.submit("--tag", "broken", bad)
    assert managers.run(flow.root) == 1  # a job it ran failed

    rows = flow.ok("list").splitlines()
    assert rows[0].split() == [
        "ID", "TAG", "STATE", "STEP", "PRIO", "ATTEMPTS", "REASON", "ELAPSED", "LIMIT",
        "PLACEMENT",
    ]  # fmt: skip
    by_tag = {r.split()[1]: r.split() for r in rows[1:]}
    assert by_tag["broken"][2:4] == ["failed", "main"] and by_tag["broken"][6] == "bad_input"
    assert by_tag["good"][2] == "succeeded" and by_tag["good"][6] == "-"

    only = orjson.loads(flow.ok("list", "--failed-code", "bad_input", "--json"))["jobs"]
    assert [r["tag"] for r in only] == ["broken"]
    assert only[0]["failure"]["code"] == "bad_input"
    assert only[0]["start"] <= only[0]["end"]
    assert orjson.loads(flow.ok("list", "--failed-code", "other", "--json"))["jobs"] == []
    assert orjson.loads(flow.ok("list", "--interrupted", "--json"))["jobs"] == []

    chosen = flow.ok("list", "--tag", "good", "--format", "tag,state,start,end").splitlines()
    assert chosen[0].split() == ["TAG", "STATE", "START", "END"]
    assert chosen[1].split()[:2] == ["good", "succeeded"] and len(chosen[1].split()) == 6

    r = flow("list", "--format", "tag,colour")
    assert r.exit_code == 2
    assert "--format tag,colour: unknown column colour" in r.stderr
    assert "columns are id, fullid, key, tag, group, state" in r.stderr
