"""Eight real processes race to claim the same ready markers: each job is claimed once."""

from __future__ import annotations

import os
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from helpers import RACER_PRELUDE, markers_in, run_racers

from httk_flow.protocol.discovery import walk_all
from httk_flow.protocol.frames import Body
from httk_flow.protocol.names import Marker, RecordRef
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.transition import transition
from httk_flow.protocol.workspace import Workspace

JOBS = 2000
RACERS = 8
PLACEMENTS = 16

#: one racer: open the workspace, wait for the start signal, claim whatever it can
RACER = RACER_PRELUDE.format(state="READY") + textwrap.dedent(
    """
    from httk_flow.errors import TransitionConflict
    from httk_flow.protocol.frames import Body
    from httk_flow.protocol.transition import transition

    successes, conflicts = [], 0
    cycle, seen = stream.cycles, 0
    while True:
        batch = stream.next_batch(64)
        seen += len(batch)
        for job in batch:
            try:
                transition(ws, job, State.CLAIMED, Body(extra=(("racer", me),)), actor=me)
            except TransitionConflict:
                conflicts += 1
            else:
                successes.append(job.job_id)
        if stream.cycles != cycle:
            if seen == 0:
                break  # a whole cycle without a ready marker: nothing left to claim
            cycle, seen = stream.cycles, 0
    json.dump(
        {"successes": successes, "conflicts": conflicts, "writer": ws.writer.writer_id},
        sys.stdout,
    )
    """
)


def _ready_workspace(root: Path) -> tuple[Workspace, set[str]]:
    ws = Workspace.create(str(root))
    specs = list(
        Submitter(ws).submit(
            SubmitRequest(program="true", placement=f"race/{i % PLACEMENTS:02d}")
            for i in range(JOBS)
        )
    )
    for job in list(walk_all(ws, State.SUBMITTED)):
        transition(ws, job, State.READY, Body(), actor="setup")
    assert len(markers_in(ws, State.READY)) == JOBS
    return ws, {s.id for s in specs}


@pytest.mark.slow
def test_eight_processes_racing_for_two_thousand_markers_claim_each_job_exactly_once(
    tmp_path: Path,
) -> None:
    ws, ids = _ready_workspace(tmp_path / "ws")
    signals = tmp_path / "signals"
    signals.mkdir()
    results = run_racers(RACER, ws.root, RACERS, signals, timeout=60)

    # every process's own account: disjoint successes that add up to every job
    winners = {job_id: racer for racer, r in results.items() for job_id in r["successes"]}
    assert sum(len(r["successes"]) for r in results.values()) == JOBS
    assert set(winners) == ids
    # how much they really overlapped is the scheduler's business (on two busy cores one
    # racer may take everything): what must hold is exactly once, whatever the interleaving

    # the workspace's account: every job claimed once, nothing left behind or lost
    assert markers_in(ws, State.READY) == []
    assert markers_in(ws, State.SUBMITTED) == []
    claimed = markers_in(ws, State.CLAIMED)
    assert len(claimed) == JOBS
    writers = {r["writer"]: racer for racer, r in results.items()}
    fresh = Workspace.open(ws.root)
    by_job = Counter[str]()
    for rel in claimed:
        marker = Marker.from_name(os.path.basename(rel))
        by_job[marker.job_id] += 1
        assert marker.generation == 2
        frame = fresh.reader.read(marker.ref)
        assert frame["by"] == winners[marker.job_id] == frame["racer"]
        assert writers[marker.ref.writer] == winners[marker.job_id]
        assert (frame["from"], frame["to"], frame["gen"]) == ("ready", "claimed", 2)
        prev = fresh.reader.read(RecordRef.parse(frame["prev"]))
        assert (prev["to"], prev["by"]) == ("ready", "setup")
    assert set(by_job) == ids
    assert set(by_job.values()) == {1}
