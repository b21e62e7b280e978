"""Eight real processes register the same submitted jobs in batches (register_many): each
job is registered once, by the process whose frame its marker names, whatever the
interleaving of their batch appends and renames."""

from __future__ import annotations

import os
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from helpers import RACER_PRELUDE, markers_in, run_racers

from httk_flow.protocol.names import Marker, RecordRef
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.workspace import Workspace

JOBS = 2000
RACERS = 8
PLACEMENTS = 16

#: one racer: wait for the start signal, register whatever its scan hands it, in batches
RACER = RACER_PRELUDE.format(state="SUBMITTED") + textwrap.dedent(
    """
    from httk_flow.errors import FlowError, TransitionConflict
    from httk_flow.protocol.jobs import register_many

    successes, conflicts, other = [], 0, []
    cycle, seen = stream.cycles, 0
    while True:
        batch = stream.next_batch(40)
        seen += len(batch)
        for h, r in zip(batch, register_many(ws, batch, actor=me), strict=True):
            if isinstance(r, TransitionConflict):
                conflicts += 1
            elif isinstance(r, FlowError):
                other.append(f"{h.key}: {r.render()}")  # a lost race read as damage
            else:
                successes.append(h.job_id)
        if stream.cycles != cycle:
            if seen == 0:
                break  # a whole cycle without a submitted marker: nothing left
            cycle, seen = stream.cycles, 0
    json.dump(
        {
            "successes": successes,
            "conflicts": conflicts,
            "other": other,
            "writer": ws.writer.writer_id,
        },
        sys.stdout,
    )
    """
)


@pytest.mark.slow
def test_eight_processes_registering_in_batches_register_each_job_exactly_once(
    tmp_path: Path,
) -> None:
    ws = Workspace.create(str(tmp_path / "ws"))
    specs = list(
        Submitter(ws).submit(
            SubmitRequest(program="true", placement=f"race/{i % PLACEMENTS:02d}")
            for i in range(JOBS)
        )
    )
    ids = {s.id for s in specs}
    signals = tmp_path / "signals"
    signals.mkdir()
    results = run_racers(RACER, ws.root, RACERS, signals, timeout=120)

    # every process's own account: disjoint successes adding up to every job, and no
    # lost race mistaken for a broken job
    for r in results.values():
        assert r["other"] == []
    winners = {job_id: racer for racer, r in results.items() for job_id in r["successes"]}
    assert sum(len(r["successes"]) for r in results.values()) == JOBS
    assert set(winners) == ids

    # the workspace's account: each job ready once, its marker naming its winner's frame
    assert markers_in(ws, State.SUBMITTED) == []
    assert markers_in(ws, State.FAILED) == []
    ready = markers_in(ws, State.READY)
    assert len(ready) == JOBS
    writers = {r["writer"]: racer for racer, r in results.items()}
    fresh = Workspace.open(ws.root)
    by_job = Counter[str]()
    for rel in ready:
        marker = Marker.from_name(os.path.basename(rel))
        by_job[marker.job_id] += 1
        assert marker.generation == 1
        frame = fresh.reader.read(marker.ref)
        assert frame["by"] == winners[marker.job_id] == writers[marker.ref.writer]
        assert (frame["from"], frame["to"], frame["gen"]) == ("submitted", "ready", 1)
        prev = fresh.reader.read(RecordRef.parse(frame["prev"]))
        assert prev["to"] == "submitted" and prev["job"] == marker.job_id
    assert set(by_job) == ids
    assert set(by_job.values()) == {1}
