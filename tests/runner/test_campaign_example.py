"""examples/campaign/run.sh, as a user runs it: three groups chained by --after, the
stages bundled with the lib.sh they source, the summary equal to a direct computation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .support import EXAMPLES


def test_the_campaign_relaxes_then_computes_properties_then_collects(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    flow = bindir / "flow"
    flow.write_text(f'#!/bin/sh\nexec {sys.executable} -m httk_flow "$@"\n')
    flow.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "NO_COLOR": "1"}
    ws = tmp_path / "campaign-ws"
    r = subprocess.run(
        ["bash", str(EXAMPLES / "campaign" / "run.sh"), str(ws)],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [
        line.split()
        for line in (ws / "results" / "summary.txt").read_text().splitlines()
        if not line.startswith("#")
    ]
    expected = [[str(i), f"{5 + i / 10:.6f}", f"{2 * (5 + i / 10) ** 2:.4f}"] for i in range(1, 9)]
    assert rows == expected
    assert r.stdout.endswith((ws / "results" / "summary.txt").read_text())
    jobs = json.loads(
        subprocess.run(
            [sys.executable, "-m", "httk_flow", "-w", str(ws), "list", "--json"],
            capture_output=True, text=True, check=True,
        ).stdout
    )["jobs"]  # fmt: skip
    assert len(jobs) == 17 and {j["state"] for j in jobs} == {"succeeded"}
    groups = json.loads(
        subprocess.run(
            [sys.executable, "-m", "httk_flow", "-w", str(ws), "groups", "--json"],
            capture_output=True, text=True, check=True,
        ).stdout
    )  # fmt: skip
    by_name = {g["group"]: g for g in (groups["groups"] if isinstance(groups, dict) else groups)}
    assert by_name["relax"]["jobs"] == 8 and by_name["props"]["jobs"] == 8
    assert by_name["collect"]["jobs"] == 1
