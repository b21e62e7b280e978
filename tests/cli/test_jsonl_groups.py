"""A --from file's lines may name their group and be held; the rest join the batch's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def flow(ws: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "httk_flow", "-w", ws, *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_lines_name_their_group_and_hold_and_the_rest_join_the_batch(
    ws: str, tmp_path: Path
) -> None:
    lines = tmp_path / "jobs.jsonl"
    lines.write_text('{"args": ["1"], "group": "alpha"}\n{"args": ["2"], "hold": true}\n{}\n')
    doc = json.loads(flow(ws, "submit", "--from", str(lines), "--json", "echo").stdout)
    batch = doc["batch"]
    assert doc["group"] == batch
    r = flow(ws, "run")
    assert r.returncode == 4, r.stderr  # the held line is left
    groups = {g["group"]: g for g in json.loads(flow(ws, "groups", "--json").stdout)["groups"]}
    assert groups["alpha"]["states"] == {"succeeded": 1}
    assert groups[batch]["states"] == {"paused": 1, "succeeded": 1}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"group": "no spaces allowed"}\n')
    r = flow(ws, "submit", "--from", str(bad), "echo")
    assert r.returncode == 2 and f"{bad}:1" in r.stderr


def test_lines_name_dependencies_of_their_own_one_set_per_selector(ws: str, tmp_path: Path) -> None:
    first = flow(ws, "submit", "--tag", "a", "true").stdout.strip()
    flow(ws, "submit", "--hold", "--tag", "b", "true")
    lines = tmp_path / "jobs.jsonl"
    lines.write_text(
        '{"after": "tag:a"}\n'
        '{"after": ["tag:a"]}\n'
        '{"after": "tag:b", "after_policy": "any"}\n'
        '{"args": ["no dependency"]}\n'
    )
    doc = json.loads(flow(ws, "submit", "--from", str(lines), "--json", "echo").stdout)
    assert doc["submitted"] == 4
    specs = [
        json.loads((Path(ws) / j["placement"] / j["key"] / "job.json").read_text())
        for j in doc["jobs"]
    ]
    afters = [[(a["selector"], a["policy"]) for a in s.get("after", [])] for s in specs]
    assert afters == [[("tag:a", "ok")], [("tag:a", "ok")], [("tag:b", "any")], []]
    assert specs[0]["after"][0]["set"] == specs[1]["after"][0]["set"]  # one set
    assert len(list((Path(ws) / ".flow" / "after").iterdir())) == 2
    assert flow(ws, "run").returncode == 4  # tag:b is held: its dependent waits
    states = {j["key"]: j["state"] for j in json.loads(flow(ws, "list", "--json").stdout)["jobs"]}
    got = [states[j["key"]] for j in doc["jobs"]]
    assert got == ["succeeded", "succeeded", "waiting", "succeeded"], first
    # a line naming no job refuses the whole file before anything is published
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"args": ["1"]}\n{"after": "tag:nosuch"}\n')
    r = flow(ws, "submit", "--from", str(bad), "echo")
    assert r.returncode == 2 and "'tag:nosuch': matches no job" in r.stderr, r.stderr
    assert len(json.loads(flow(ws, "list", "--json").stdout)["jobs"]) == 6
