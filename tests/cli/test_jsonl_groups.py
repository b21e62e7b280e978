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
