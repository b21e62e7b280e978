"""Naming a job (flow show/cancel/logs/wait ID) while a manager moves it: the lookup lists
the state kinds one after another, and must not see the job twice."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from manager.support import submit, write_script

from httk_flow import jobs
from httk_flow.states import State
from httk_flow.transition import transition
from httk_flow.workspace import Workspace

from .support import handle_of


def test_a_job_moving_while_it_is_looked_up_is_found_once(
    root: str, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    [jid] = submit(root, write_script(scripts, "ok.sh", "exit 0\n"))
    ws = Workspace.open(root)
    try:
        h = handle_of(ws, jid)
        submitted = ws.state_dir(State.SUBMITTED, h.placement)
        real = os.listdir
        moved: list[bool] = []

        def listdir(path: str) -> list[str]:
            names = real(path)
            if path == submitted and not moved:
                moved.append(True)  # a manager registers the job just after this listing
                transition(ws, h, State.READY, {}, actor="mover")
            return names

        monkeypatch.setattr(os, "listdir", listdir)
        found = jobs.find(ws, jid)
        assert moved
        assert found.key == h.key
    finally:
        ws.close()
