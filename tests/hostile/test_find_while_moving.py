"""Naming a job (flow show/cancel/logs/wait ID) while a manager moves it: the lookup lists
the state kinds one after another, and must not see the job twice."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from manager.support import submit, write_script

from httk_flow.ops import lookup
from httk_flow.protocol.frames import Body
from httk_flow.protocol.fsio import FileSystem, set_filesystem
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import transition
from httk_flow.protocol.workspace import Workspace

from .support import handle_of


def test_a_job_moving_while_it_is_looked_up_is_found_once(
    root: str, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    [jid] = submit(root, write_script(scripts, "ok.sh", "exit 0\n"))
    ws = Workspace.open(root)
    try:
        h = handle_of(ws, jid)
        submitted = ws.state_dir(State.SUBMITTED, h.placement)
        moved: list[bool] = []

        def move_after(path: str) -> None:
            if path == submitted and not moved:
                moved.append(True)  # a manager registers the job just after this listing
                transition(ws, h, State.READY, Body(), actor="mover")

        # the lookup lists through the filesystem seam, or (older code) os.listdir
        class Moving(FileSystem):
            def scandir(self, path: str) -> Iterator[os.DirEntry[str]]:
                entries = list(super().scandir(path))
                move_after(path)
                return iter(entries)

        real = os.listdir

        def listdir(path: str) -> list[str]:
            names = real(path)
            move_after(path)
            return names

        monkeypatch.setattr(os, "listdir", listdir)
        set_filesystem(Moving())
        found = lookup.find(ws, jid)
        assert moved
        assert found.key == h.key
    finally:
        ws.close()
