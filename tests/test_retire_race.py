"""State directories retired while markers are renamed into them: real processes race.

Movers move their own jobs ready -> paused -> ready over and over through the verified
transition; retirers remove the two state directories of the placement whenever they are
empty (with no size floor, so every emptiness is a chance to race). No marker may be lost
and no transition may fail; the movers must have made a directory again meanwhile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

from httk_flow.protocol import fsio
from httk_flow.protocol.discovery import walk_all
from httk_flow.protocol.frames import Body
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.transition import transition
from httk_flow.protocol.workspace import Workspace

JOBS = 4
MOVERS = 2
RETIRERS = 2
ROUNDS = 600
PLACEMENT = "race/p"

#: one mover: its jobs back and forth between ready and paused, counting what it made again
MOVER = textwrap.dedent(
    """
    import json, os, sys, time
    from httk_flow.protocol.discovery import walk_all
    from httk_flow.protocol.frames import Body
    from httk_flow.protocol.fsio import FileSystem, set_filesystem
    from httk_flow.protocol.states import State
    from httk_flow.protocol.transition import transition
    from httk_flow.protocol.workspace import Workspace

    class Counting(FileSystem):
        made = 0
        def makedirs(self, path):
            Counting.made += 1
            return super().makedirs(path)

    root, me, movers, rounds, signals = sys.argv[1:6]
    ws = Workspace.open(root)
    set_filesystem(Counting())
    mine = sorted(walk_all(ws, State.READY), key=lambda h: h.key)[int(me)::int(movers)]
    open(os.path.join(signals, "ready-m" + me), "w").close()
    while not os.path.exists(os.path.join(signals, "go")):
        time.sleep(0.001)  # polls for the start signal
    errors = []
    for _ in range(int(rounds)):
        for i, h in enumerate(mine):
            try:
                h = transition(ws, h, State.PAUSED, Body(), actor="m" + me)
                mine[i] = transition(ws, h, State.READY, Body(), actor="m" + me)
            except Exception as e:
                errors.append(repr(e))
                break
        if errors:
            break
    json.dump({"made": Counting.made, "errors": errors}, sys.stdout)
    """
)

#: one retirer: removes the placement's ready and paused directories whenever they are empty
RETIRER = textwrap.dedent(
    """
    import json, os, sys, time
    from httk_flow.protocol.fsio import retire_dir

    state, placement, signals = sys.argv[1:4]
    dirs = [os.path.join(state, kind, placement) for kind in ("ready", "paused")]
    open(os.path.join(signals, "ready-r" + str(os.getpid())), "w").close()
    while not os.path.exists(os.path.join(signals, "go")):
        time.sleep(0.001)  # polls for the start signal
    removed = 0
    while not os.path.exists(os.path.join(signals, "stop")):
        for d in dirs:
            removed += retire_dir(d, 0)
    json.dump({"removed": removed}, sys.stdout)
    """
)


def _run_race(tmp_path: Path) -> tuple[Workspace, list[dict[str, object]], int]:
    ws = Workspace.create(str(tmp_path / "ws"))
    list(
        Submitter(ws).submit(
            SubmitRequest(program="true", placement=PLACEMENT) for _ in range(JOBS)
        )
    )
    for job in list(walk_all(ws, State.SUBMITTED)):
        transition(ws, job, State.READY, Body(), actor="setup")
    signals = tmp_path / "signals"
    signals.mkdir()
    movers = [
        subprocess.Popen(
            [sys.executable, "-c", MOVER, ws.root, str(i), str(MOVERS), str(ROUNDS), signals],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(MOVERS)
    ]
    retirers = [
        subprocess.Popen(
            [sys.executable, "-c", RETIRER, ws.state_root, PLACEMENT, signals],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(RETIRERS)
    ]
    while len(os.listdir(signals)) < MOVERS + RETIRERS:
        for p in movers + retirers:
            assert p.poll() is None, "a racer died before the start"
    (signals / "go").touch()
    results = [json.loads(p.communicate(timeout=600)[0]) for p in movers]
    (signals / "stop").touch()
    removed = sum(json.loads(p.communicate(timeout=60)[0])["removed"] for p in retirers)
    return ws, results, removed


def test_no_marker_is_lost_and_no_rename_fails_while_directories_are_retired(
    tmp_path: Path,
) -> None:
    ws, results, removed = _run_race(tmp_path)
    assert [r["errors"] for r in results] == [[]] * MOVERS
    keys: Counter[str] = Counter()
    for st in State:
        for h in walk_all(ws, st):
            keys[h.key] += 1
    assert len(keys) == JOBS and set(keys.values()) == {1}, keys
    assert len(list(walk_all(ws, State.READY))) == JOBS
    # the race really happened: directories were retired under the movers, who made
    # them again (a rename that found its directory gone)
    assert removed > 0
    assert sum(int(str(r["made"])) for r in results) > 0
    ws.close()


def test_retire_dir_keeps_a_directory_that_is_small_or_not_empty(tmp_path: Path) -> None:
    d = tmp_path / "shard"
    d.mkdir()
    assert not fsio.retire_dir(str(d), 16 * 1024)  # a fresh directory is one block
    assert d.is_dir()
    (d / "m").touch()
    assert not fsio.retire_dir(str(d), 0)  # rmdir refuses a directory with a name in it
    assert (d / "m").exists()
    (d / "m").unlink()
    assert fsio.retire_dir(str(d), 0)
    assert not d.exists()
    assert not fsio.retire_dir(str(d), 0)  # gone already: nothing to do


def test_rename_recreating_makes_the_directory_again(tmp_path: Path) -> None:
    src = tmp_path / "a"
    src.touch()
    dst = tmp_path / "gone" / "deeper" / "b"
    fsio.rename_recreating(str(src), str(dst))
    assert dst.exists() and not src.exists()
